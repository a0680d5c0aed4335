//! Each function's Redis ACL user is refused what its function does not run (NOPERM).

use crate::new_env;
use seckill_shared::infra::config::RedisTopology;
use std::collections::BTreeSet;

/// Each function's Redis user as scripts/redis_acl.py declares it: (binary, user, the commands
/// it may send, lowercase).
fn declared_redis_users() -> Vec<(String, String, BTreeSet<String>)> {
    let users = testkit::redis_acl_users();
    let users = users.as_object().expect("a JSON object").clone();
    users
        .into_iter()
        .map(|(binary, spec)| {
            let allowed = spec["access"]
                .as_str()
                .unwrap()
                .split(' ')
                .filter_map(|rule| rule.strip_prefix('+'))
                .map(str::to_string)
                .collect();
            (binary, spec["user"].as_str().unwrap().to_string(), allowed)
        })
        .collect()
}

/// Refused by the ACL: NOPERM for a command or key, the script error for a command a script
/// called.
fn assert_refused<T: std::fmt::Debug>(user: &str, what: &str, result: redis::RedisResult<T>) {
    match result {
        Err(e)
            if e.code() == Some("NOPERM") || e.to_string().contains("can't run this command") => {}
        other => panic!("{user}: {what} should be refused by its ACL, got {other:?}"),
    }
}

/// Every function's Redis user is refused what its function does not run: the server's
/// administration, keys outside `seckill:`, each data command its scripts do not call, also
/// from inside a script. The users are
/// the ones scripts/stack.sh created from scripts/redis_acl.py; the runs above prove each one
/// is enough for its function's path.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_redis_user_is_refused_what_its_function_does_not_run() -> anyhow::Result<()> {
    let env = new_env().await;
    let key = format!("{}:acl-probe", env.config.key_prefix);
    let users = declared_redis_users();
    assert_eq!(
        users.len(),
        5,
        "one user per function that uses Redis: {users:?}"
    );
    // Commands some function's scripts call; each user must be refused those its own do not.
    let data_commands: [(&str, &[&str]); 14] = [
        ("del", &[]),
        ("set", &["1"]),
        ("zrange", &["0", "-1"]),
        ("zscore", &["u"]),
        ("hsetnx", &["f", "1"]),
        ("hlen", &[]),
        ("pttl", &[]),
        ("decr", &[]),
        ("incr", &[]),
        ("pexpire", &["1000"]),
        ("pexpireat", &["1"]),
        ("hgetall", &[]),
        ("hkeys", &[]),
        ("hscan", &["0"]),
    ];
    let mut refused_somewhere = BTreeSet::new();
    for (binary, user, allowed) in &users {
        let mut config = env.config.clone();
        config.redis = config.redis.with_login(&testkit::local_redis_login(user))?;
        let RedisTopology::Standalone(url) = &config.redis else {
            unreachable!("the role tests run on standalone Redis")
        };
        let client = redis::Client::open(url.expose())?;
        let mut con = client
            .get_multiplexed_async_connection()
            .await
            .unwrap_or_else(|e| panic!("{user} logs in ({e}): bash scripts/stack.sh creates it"));
        let pong: String = redis::cmd("PING").query_async(&mut con).await?;
        assert_eq!(pong, "PONG", "{user}");

        for (name, args) in [
            ("FLUSHALL", vec![]),
            ("KEYS", vec!["*"]),
            ("CONFIG", vec!["GET", "maxmemory"]),
            ("SCRIPT", vec!["FLUSH"]),
            // No function loads a script: it would run any text it liked.
            ("SCRIPT", vec!["LOAD", "while true do end"]),
            ("ACL", vec!["LIST"]),
            ("EVAL", vec!["return 1", "0"]),
            ("CLIENT", vec!["LIST"]),
            ("INFO", vec!["server"]),
            ("SCAN", vec!["0"]),
        ] {
            let result: redis::RedisResult<redis::Value> =
                redis::cmd(name).arg(&args).query_async(&mut con).await;
            assert_refused(user, &format!("{name} {args:?}"), result);
        }
        let outside: redis::RedisResult<Option<String>> = redis::cmd("HGET")
            .arg("other:{1}:meta")
            .arg("stock")
            .query_async(&mut con)
            .await;
        assert_refused(user, "a key outside seckill:", outside);

        for (command, args) in data_commands {
            if allowed.contains(command) {
                continue;
            }
            refused_somewhere.insert(command);
            let result: redis::RedisResult<redis::Value> = redis::cmd(command)
                .arg(&key)
                .arg(args)
                .query_async(&mut con)
                .await;
            assert_refused(user, command, result);
        }

        // EVALSHA is no way around the ACL: a script's commands are checked as the user's.
        if !allowed.contains("del") {
            let result: redis::RedisResult<redis::Value> =
                redis::Script::new("return redis.call('DEL', KEYS[1])")
                    .key(&key)
                    .invoke_async(&mut con)
                    .await;
            assert_refused(user, &format!("{binary}: DEL inside a script"), result);
        }
    }
    // The list above is not vacuous: every one of its commands is some user's refusal.
    assert_eq!(
        refused_somewhere.len(),
        data_commands.len(),
        "{refused_somewhere:?}"
    );
    Ok(())
}

/// scripts/redis_acl.py counts, for each script, the commands of the prelude functions the
/// loader puts before it: both pick the same ones, so no user lacks a command a script runs
/// through the prelude, and none gains one its scripts do not use.
#[test]
fn the_acl_derivation_and_the_loader_pick_the_same_prelude_functions() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for (script, source) in seckill_shared::store::scripts::SOURCES {
        let out = std::process::Command::new("python3")
            .arg(root.join("scripts/redis_acl.py"))
            .args(["prelude", script])
            .output()
            .expect("python3 runs scripts/redis_acl.py");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let derived: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .map(str::to_string)
            .collect();
        let loaded: Vec<String> = seckill_shared::store::scripts::prelude_for(source)
            .iter()
            .map(|f| f.name.to_string())
            .collect();
        assert_eq!(derived, loaded, "{script}");
    }
}

/// The loader (scripts/redis_acl.py's `seckill-loader`) may load a script and nothing else: it
/// runs none (EVALSHA), reads and writes no key, administers nothing; and
/// `seckill_shared::infra::shape::LOADER_REDIS_USER` names the same user.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_loader_may_load_a_script_and_nothing_else() -> anyhow::Result<()> {
    let env = new_env().await;
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = std::process::Command::new("python3")
        .arg(root.join("scripts/redis_acl.py"))
        .arg("loader")
        .output()?;
    let declared: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let user = seckill_shared::infra::shape::LOADER_REDIS_USER;
    assert_eq!(declared["user"], user);

    let mut config = env.config.clone();
    config.redis = config.redis.with_login(&testkit::local_redis_login(user))?;
    let RedisTopology::Standalone(url) = &config.redis else {
        unreachable!("the role tests run on standalone Redis")
    };
    let mut con = redis::Client::open(url.expose())?
        .get_multiplexed_async_connection()
        .await?;
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg("return 1")
        .query_async(&mut con)
        .await?;
    assert_eq!(sha, redis::Script::new("return 1").get_hash());
    let key = format!("{}:acl-probe", env.config.key_prefix);
    for (name, args) in [
        ("EVALSHA", vec![sha.as_str(), "0"]),
        ("EVAL", vec!["return 1", "0"]),
        ("GET", vec![key.as_str()]),
        ("HSET", vec![key.as_str(), "f", "1"]),
        ("SCRIPT", vec!["FLUSH"]),
        ("SCRIPT", vec!["KILL"]),
        ("FLUSHALL", vec![]),
        ("CONFIG", vec!["GET", "maxmemory"]),
    ] {
        let result: redis::RedisResult<redis::Value> =
            redis::cmd(name).arg(&args).query_async(&mut con).await;
        assert_refused(user, &format!("{name} {args:?}"), result);
    }
    Ok(())
}
