# shellcheck shell=bash
# Local environment for seckill. Source it:  source scripts/env.sh
# Every variable is a default only: a value already in the caller's environment wins.
# (The Makefile sources this before every recipe; scripts/stack.sh starts the services it names.)
# This is the one place for the local stack's addresses: shared::Config has no default for
# DATABASE_URL, REDIS_URL or ORDER_QUEUE_URL, so a binary or test run without this file says
# which one is missing.

_seckill_repo="$(cd "$(dirname "${BASH_SOURCE[0]:-$0}")/.." && pwd)"

# PostgreSQL (system of record) and Redis (standalone + 3-master cluster for cluster tests)
: "${DATABASE_URL:=postgres://postgres@127.0.0.1:5432/seckill}"
: "${REDIS_URL:=redis://127.0.0.1:6379}"
: "${REDIS_CLUSTER_URLS:=redis://127.0.0.1:7001,redis://127.0.0.1:7002,redis://127.0.0.1:7003}"
# Valkey standalone: `make test` runs every standalone-Redis test against it as well.
: "${VALKEY_URL:=redis://127.0.0.1:6380}"

# AWS SDK -> the local SQS emulator (moto_server). Dummy credentials; the SDK reads
# AWS_ENDPOINT_URL_SQS by itself. moto's default account id is 123456789012: this is the exact
# QueueUrl its CreateQueue returns for the queues scripts/stack.sh creates.
: "${AWS_REGION:=us-east-1}"
: "${AWS_DEFAULT_REGION:=us-east-1}"
: "${AWS_ACCESS_KEY_ID:=test}"
: "${AWS_SECRET_ACCESS_KEY:=test}"
: "${AWS_ENDPOINT_URL_SQS:=http://127.0.0.1:4566}"
: "${ORDER_QUEUE_URL:=http://127.0.0.1:4566/123456789012/seckill-orders}"
: "${ORDER_DLQ_URL:=http://127.0.0.1:4566/123456789012/seckill-orders-dlq}"
# The draw entries' queue of their own (it redrives into the same DLQ).
: "${ENTRY_QUEUE_URL:=http://127.0.0.1:4566/123456789012/seckill-orders-entries}"

# A function binary run locally (`cargo lambda watch`, the tests' Lambda runtime runs) logs in
# as its own database role and Redis ACL user, the local stack's stand-in for the secrets each
# function reads in AWS (functions/shape.toml names them).
: "${SECKILL_LOCAL_LOGINS:=true}"

# HS256 secret the dev server verifies user tokens with (local only; AWS uses the JWT authorizer)
: "${SECKILL_JWT_SECRET:=local-dev-secret-change-me}"

# Payments: the dev server's local provider, and the secret its signed webhook events carry
# (Stripe's scheme; local only: in AWS the provider's own secret)
: "${PAYMENT_PROVIDER:=local}"
: "${PAYMENT_WEBHOOK_SECRET:=whsec_local_dev_change_me}"

# sqlx::query! checks every statement at compile time against the committed .sqlx/ (offline
# data), so builds need no database. After changing a query: `make sqlx-prepare`, commit .sqlx/.
: "${SQLX_OFFLINE:=true}"

# Tools: no telemetry from SAM CLI
: "${SAM_CLI_TELEMETRY:=0}"

export DATABASE_URL REDIS_URL REDIS_CLUSTER_URLS VALKEY_URL \
    AWS_REGION AWS_DEFAULT_REGION AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY \
    AWS_ENDPOINT_URL_SQS ORDER_QUEUE_URL ORDER_DLQ_URL ENTRY_QUEUE_URL \
    SECKILL_LOCAL_LOGINS SECKILL_JWT_SECRET PAYMENT_PROVIDER PAYMENT_WEBHOOK_SECRET SQLX_OFFLINE SAM_CLI_TELEMETRY

# The project's Python tools (moto_server, cfn-lint; cargo-lambda and sam after `make tools-lambda`),
# appended so that the machine's own tools keep precedence.
case ":${PATH}:" in
    *":${_seckill_repo}/.tools/venv/bin:"*) ;;
    *) export PATH="${PATH}:${_seckill_repo}/.tools/venv/bin" ;;
esac
unset _seckill_repo
