"""The functions' security groups: egress to RDS Proxy, Redis and HTTPS only, in each network mode."""

from __future__ import annotations

from .model import Template, as_list, target_of
from .report import check


# The network modes the template supports: its own VPC, or given subnets.
NETWORK_MODES = (("created VPC", {"VpcId": "", "PrivateSubnetIds": ""}),
                 ("given VPC", {"VpcId": "vpc-0given", "PrivateSubnetIds": "subnet-0a,subnet-0b"}))


def egress_rules(t: Template, sg: str) -> list[dict]:
    rules = [dict(r, _inline=True) for r in t.evaluate(t.resources[sg].get("Properties", {}).get("SecurityGroupEgress") or [])]
    for _, r in t.of_type("AWS::EC2::SecurityGroupEgress"):
        props = t.evaluate(r.get("Properties", {}))
        if target_of(props.get("GroupId")) == sg:
            rules.append(props)
    return rules


def check_egress(t: Template) -> None:
    """The functions' security group lets out PostgreSQL to the proxy, Redis, and HTTPS only."""
    for mode, params in NETWORK_MODES:
        m = t.with_params(**params)
        sgs = {target_of(g) for g in as_list((m.globals.get("VpcConfig") or {}).get("SecurityGroupIds") or [])}
        for _, fn in m.functions():
            sgs |= {target_of(g) for g in as_list((fn.get("Properties", {}).get("VpcConfig") or {}).get("SecurityGroupIds") or [])}
        proxy_sgs = {target_of(g) for _, r in m.of_type("AWS::RDS::DBProxy")
                     for g in as_list(r["Properties"].get("VpcSecurityGroupIds") or [])}
        redis_sgs = {target_of(g) for _, r in m.of_type("AWS::ElastiCache::ReplicationGroup")
                     for g in as_list(r["Properties"].get("SecurityGroupIds") or [])}
        endpoint_sgs = {target_of(g) for _, r in m.of_type("AWS::EC2::VPCEndpoint")
                        for g in as_list(r["Properties"].get("SecurityGroupIds") or [])}
        for sg in sorted(s for s in sgs if s):
            rules = egress_rules(m, sg)
            problems, reaches = [], set()
            if not any(r.get("_inline") for r in rules):
                problems.append("no inline egress rule, so EC2's default allow-all stays")
            for r in rules:
                proto, lo, hi = str(r.get("IpProtocol")), r.get("FromPort"), r.get("ToPort")
                dest = target_of(r.get("DestinationSecurityGroupId"))
                cidr = r.get("CidrIp") or r.get("CidrIpv6")
                if proto == "-1" and cidr == "127.0.0.1/32" and r.get("_inline"):
                    continue  # the placeholder that removes the default rule
                if proto != "tcp" or lo != hi:
                    problems.append(f"{proto} {lo}-{hi} to {dest or cidr}")
                elif lo == 5432 and dest in proxy_sgs:
                    reaches.add("proxy")
                elif lo == 6379 and dest in redis_sgs:
                    reaches.add("redis")
                elif lo == 443 and (dest in endpoint_sgs or (not endpoint_sgs and cidr == "0.0.0.0/0")):
                    reaches.add("https")
                else:
                    problems.append(f"tcp {lo} to {dest or cidr}")
            missing = {"proxy", "redis", "https"} - reaches
            if missing:
                problems.append(f"cannot reach {sorted(missing)}")
            check(not problems, f"{sg} ({mode}): egress only 5432 to RDS Proxy, 6379 to Redis, 443 to "
                  f"{'the endpoints' if endpoint_sgs else 'HTTPS'}" + (f" -- {problems}" if problems else ""))
