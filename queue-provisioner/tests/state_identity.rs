//! A namespace's state identity on the real Redis of tests/services (docs/DESIGN.md §9): the
//! provisioner's admin client makes the namespace's user with the rules of
//! `asya_api::state_proxy::redis_acl`; connected as that user, a client reaches its own
//! namespace's keys and nothing else (Redis itself refuses); a rotated password replaces the
//! old; a deleted user's connections are closed; the owner mark is set once and kept. Run
//! `tests/services/up` and `source tests/services/env` first; without them the test skips
//! (`make unit` fails instead).

use asya_queue_provisioner::state_identity::plan;
use asya_queue_provisioner::state_identity::redis_admin::RedisAdmin;

#[path = "../../tests/services/require.rs"]
mod require;

fn servers() -> bool {
    require::services(
        "Redis",
        "tests/services/up && source tests/services/env",
        &["ASYA_TEST_REDIS_PASSWORD"],
    )
}

fn port() -> String {
    std::env::var("ASYA_TEST_REDIS_PORT").unwrap_or_else(|_| "6379".into())
}

fn admin() -> RedisAdmin {
    let password = std::env::var("ASYA_TEST_REDIS_PASSWORD").expect("checked");
    RedisAdmin::new(
        &format!("redis://127.0.0.1:{}", port()),
        "default",
        &password,
    )
    .expect("admin client")
}

/// A connection as the admin (the test server's default user, ASYA_TEST_REDIS_URL).
async fn root() -> redis::aio::MultiplexedConnection {
    let url = std::env::var("ASYA_TEST_REDIS_URL").expect("ASYA_TEST_REDIS_URL");
    redis::Client::open(url)
        .expect("admin URL")
        .get_multiplexed_async_connection()
        .await
        .expect("admin connection")
}

/// A connection as `user`, or the error Redis answers to its AUTH.
async fn connect_as(
    user: &str,
    password: &str,
) -> Result<redis::aio::MultiplexedConnection, String> {
    let url = format!("redis://{user}:{password}@127.0.0.1:{}", port());
    let client = redis::Client::open(url).map_err(|e| e.to_string())?;
    client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| e.to_string())
}

async fn run(
    c: &mut redis::aio::MultiplexedConnection,
    args: &[&str],
) -> Result<redis::Value, String> {
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query_async(c).await.map_err(|e| e.to_string())
}

fn unique(what: &str) -> String {
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("t{what}{}", n % 1_000_000_000)
}

#[tokio::test]
async fn a_namespace_user_reaches_its_own_keys_and_nothing_else() {
    if !servers() {
        return;
    }
    let admin = admin();
    let (a, b) = (unique("a"), unique("b"));
    let (ua, ub) = (plan::user(&a), plan::user(&b));
    admin.put_user(&a, "pw-a-0123456789").await.unwrap();
    admin.put_user(&b, "pw-b-0123456789").await.unwrap();

    let mut ca = connect_as(&ua, "pw-a-0123456789").await.unwrap();
    let mut cb = connect_as(&ub, "pw-b-0123456789").await.unwrap();
    let ka = format!("{a}/secret");
    run(&mut ca, &["HSET", &ka, "d", "A's"]).await.unwrap();
    // What a connector does is allowed in its own namespace ...
    assert!(
        run(&mut cb, &["HSET", &format!("{b}/x"), "d", "B's"])
            .await
            .is_ok()
    );
    // ... and nothing of A's, nor any server-wide command, is.
    for cmd in [
        vec!["HGET", ka.as_str(), "d"],
        vec!["HGETALL", ka.as_str()],
        vec!["DEL", ka.as_str()],
        vec!["HSET", ka.as_str(), "d", "forged"],
        vec!["KEYS", "*"],
        vec!["SCAN", "0"],
        vec!["FLUSHALL"],
        vec!["CONFIG", "GET", "*"],
        vec!["ACL", "LIST"],
        vec![
            "EVAL",
            "return redis.call('HGET', KEYS[1], 'd')",
            "1",
            ka.as_str(),
        ],
    ] {
        let e = run(&mut cb, &cmd)
            .await
            .expect_err(&format!("{cmd:?} was allowed"));
        assert!(e.to_uppercase().contains("NOPERM"), "{cmd:?}: {e}");
    }
    let still: redis::Value = run(&mut ca, &["HGET", &ka, "d"]).await.unwrap();
    assert_eq!(still, redis::Value::BulkString(b"A's".to_vec()));

    // Rotation: the new password only.
    admin.put_user(&b, "pw-b-rotated-0123").await.unwrap();
    let e = connect_as(&ub, "pw-b-0123456789")
        .await
        .expect_err("old password");
    assert!(
        e.contains("WRONGPASS") || e.contains("authentication failed"),
        "{e}"
    );
    connect_as(&ub, "pw-b-rotated-0123").await.unwrap();

    // Deleted: its connections are closed and it cannot come back.
    admin.delete_user(&ua).await.unwrap();
    assert!(
        run(&mut ca, &["HGET", &ka, "d"]).await.is_err(),
        "a deleted user's connection stays"
    );
    assert!(connect_as(&ua, "pw-a-0123456789").await.is_err());
    admin.delete_user(&ub).await.unwrap();

    // Clean up as the admin.
    let mut root = root().await;
    run(&mut root, &["DEL", &ka, &format!("{b}/x")])
        .await
        .unwrap();
}

#[tokio::test]
async fn the_owner_mark_is_set_once_and_kept() {
    if !servers() {
        return;
    }
    let admin = admin();
    let ns = unique("n");
    assert_eq!(admin.claim_owner(&ns, "uid-1").await.unwrap(), None);
    assert_eq!(
        admin.claim_owner(&ns, "uid-1").await.unwrap(),
        Some("uid-1".into())
    );
    // A namespace made again (another uid) finds the first one's mark, unchanged.
    assert_eq!(
        admin.claim_owner(&ns, "uid-2").await.unwrap(),
        Some("uid-1".into())
    );
    assert_eq!(
        admin.claim_owner(&ns, "uid-2").await.unwrap(),
        Some("uid-1".into())
    );
    let mut root = root().await;
    run(&mut root, &["DEL", &plan::owner_key(&ns)])
        .await
        .unwrap();
}

#[tokio::test]
async fn the_test_servers_default_user_needs_a_password() {
    if !servers() {
        return;
    }
    // What tests/services/redis starts: no shared way in, so no Warning.
    assert!(!admin().default_user_open().await.unwrap());
}
