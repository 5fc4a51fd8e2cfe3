//! One suite for every [`Backend`]: the rules the HTTP and MCP layers rely on, checked
//! against memory always and against PostgreSQL when `ASYA_TEST_POSTGRES_URL` names a server
//! (`source tests/services/env` after `tests/services/up`, or `make unit`).

use serde_json::json;

use asya_transport::fanin::{BranchReport, JoinAnswer};

use super::Backend;
use super::memory::Memory;
use super::model::{Event, Final, JoinRefused, Progress, Record, Status, now_ms};
use super::postgres::Postgres;

fn rec(id: &str, parent: Option<&str>) -> Record {
    let now = now_ms();
    Record {
        id: id.into(),
        parent_id: parent.map(str::to_string),
        tool: Some("t".into()),
        status: Status::Pending,
        progress: 0.0,
        actor: None,
        route: vec!["a".into(), "b".into()],
        result: None,
        error: None,
        created_ms: now,
        updated_ms: now,
        namespace: Some("team".into()),
    }
}

fn prog(actor: &str, phase: &str, current: usize) -> Progress {
    Progress {
        actor: actor.into(),
        phase: phase.into(),
        current,
        total: 2,
        message: None,
        parent_id: None,
    }
}

fn fin(
    status: Status,
    actor: Option<&str>,
    result: Option<serde_json::Value>,
    error: Option<serde_json::Value>,
) -> Final {
    Final {
        status,
        actor: actor.map(str::to_string),
        result,
        error,
    }
}

async fn progress<B: Backend>(b: &B, id: &str, p: &Progress) -> Option<Record> {
    b.progress(id, p, &Event::of_progress(p)).await.unwrap()
}

async fn finish<B: Backend>(b: &B, id: &str, f: &Final) -> Option<(Record, bool)> {
    b.finish(id, f, &Event::of_final(f)).await.unwrap()
}

/// Runs every check against `b`, which must be empty.
async fn suite<B: Backend>(b: &B) {
    b.ping().await.unwrap();
    // First: it counts what is stored, and leaves nothing behind.
    retention_deletes_by_age_in_bounded_batches(b).await;
    create_keeps_the_first_record(b).await;
    progress_never_goes_back(b).await;
    first_final_wins(b).await;
    unknown_ids(b).await;
    children_and_history(b).await;
    namespace_is_kept(b).await;
    fanin_counts_each_branch_once(b).await;
    fanin_fails_once_on_the_first_error(b).await;
    fanin_joins_once_under_concurrent_reports(b).await;
    fanins_expire_by_age(b).await;
}

/// After the fan-in checks: joins team/p, team/f, team/c done, other/p waiting.
async fn fanins_expire_by_age<B: Backend>(b: &B) {
    let past = now_ms() - 60_000;
    assert_eq!(
        b.expire_joins(Some(past), Some(past), 100).await.unwrap(),
        0
    );
    let soon = now_ms() + 1000;
    assert_eq!(
        b.expire_joins(Some(soon), None, 2).await.unwrap(),
        2,
        "bounded"
    );
    assert_eq!(b.expire_joins(Some(soon), None, 100).await.unwrap(), 1);
    assert_eq!(b.expire_joins(None, Some(soon), 100).await.unwrap(), 1);
    // Gone: the same join id starts afresh.
    let r = branch(3, Some(json!(1)), None);
    assert_eq!(
        post(b, "team", "p", 0, &r).await,
        JoinAnswer::Waiting {
            stored: 1,
            total: 3
        }
    );
    assert_eq!(b.expire_joins(None, Some(soon), 100).await.unwrap(), 1);
}

fn branch(
    total: u32,
    result: Option<serde_json::Value>,
    error: Option<serde_json::Value>,
) -> BranchReport {
    BranchReport {
        total,
        namespace: "team".into(),
        result,
        error,
    }
}

async fn post<B: Backend>(b: &B, ns: &str, join: &str, i: u32, r: &BranchReport) -> JoinAnswer {
    b.branch(ns, join, i, r).await.unwrap().unwrap()
}

async fn fanin_counts_each_branch_once<B: Backend>(b: &B) {
    let ok = |v| branch(3, Some(v), None);
    let waiting = |stored| JoinAnswer::Waiting { stored, total: 3 };
    assert_eq!(post(b, "team", "p", 2, &ok(json!("c"))).await, waiting(1));
    // A duplicate (even with another result) changes nothing and does not count.
    assert_eq!(
        post(b, "team", "p", 2, &ok(json!("other"))).await,
        waiting(1)
    );
    // The same join id in another namespace is another join.
    assert_eq!(post(b, "other", "p", 0, &ok(json!("x"))).await, waiting(1));
    assert_eq!(
        post(b, "team", "p", 0, &ok(json!({"a": 1}))).await,
        waiting(2)
    );
    let complete = JoinAnswer::Complete {
        results: vec![json!({"a": 1}), json!("b"), json!("c")],
    };
    assert_eq!(post(b, "team", "p", 1, &ok(json!("b"))).await, complete);
    // Redelivered, the report that completed the join hears it again; the others do not.
    assert_eq!(post(b, "team", "p", 1, &ok(json!("b"))).await, complete);
    assert_eq!(
        post(b, "team", "p", 0, &ok(json!("late"))).await,
        JoinAnswer::Joined
    );
    // Another total for the same join is refused, and changes nothing.
    let refused = b
        .branch("team", "p", 0, &branch(4, Some(json!(1)), None))
        .await
        .unwrap();
    assert!(
        matches!(refused, Err(JoinRefused::Mismatch { stored: 3, .. })),
        "{refused:?}"
    );
    assert_eq!(post(b, "team", "p", 1, &ok(json!("b"))).await, complete);
}

async fn fanin_fails_once_on_the_first_error<B: Backend>(b: &B) {
    let err = json!({"type": "ValueError", "mro": ["ValueError", "Exception"], "message": "m"});
    let w = post(b, "team", "f", 0, &branch(3, Some(json!(1)), None)).await;
    assert_eq!(
        w,
        JoinAnswer::Waiting {
            stored: 1,
            total: 3
        }
    );
    let failed = JoinAnswer::Failed {
        index: 1,
        error: err.clone(),
    };
    assert_eq!(
        post(b, "team", "f", 1, &branch(3, None, Some(err.clone()))).await,
        failed
    );
    let other = json!({"type": "KeyError"});
    assert_eq!(
        post(b, "team", "f", 2, &branch(3, None, Some(other))).await,
        JoinAnswer::Joined
    );
    assert_eq!(
        post(b, "team", "f", 1, &branch(3, None, Some(err))).await,
        failed
    );
}

async fn fanin_joins_once_under_concurrent_reports<B: Backend>(b: &B) {
    let n = 16u32;
    // Every branch twice, all at once: the join fires on one index; only that index's
    // reports (the one that fired it, and its copy as a redelivery) hear Complete.
    let reports: Vec<_> = (0..2 * n)
        .map(|k| {
            let i = k % n;
            async move {
                (
                    i,
                    post(b, "team", "c", i, &branch(n, Some(json!(i * 10)), None)).await,
                )
            }
        })
        .collect();
    let answers = futures::future::join_all(reports).await;
    let complete: Vec<_> = answers
        .iter()
        .filter(|(_, a)| matches!(a, JoinAnswer::Complete { .. }))
        .collect();
    let firing: std::collections::BTreeSet<u32> = complete.iter().map(|(i, _)| *i).collect();
    assert_eq!(firing.len(), 1, "{answers:?}");
    let want: Vec<_> = (0..n).map(|i| json!(i * 10)).collect();
    for (_, a) in &complete {
        assert_eq!(
            *a,
            JoinAnswer::Complete {
                results: want.clone()
            }
        );
    }
    let waiting = answers
        .iter()
        .filter(|(_, a)| matches!(a, JoinAnswer::Waiting { .. }))
        .count();
    assert_eq!(
        waiting
            + complete.len()
            + answers
                .iter()
                .filter(|(_, a)| *a == JoinAnswer::Joined)
                .count(),
        answers.len()
    );
}

async fn create_keeps_the_first_record<B: Backend>(b: &B) {
    let first = b.create(&rec("c", None)).await.unwrap();
    assert_eq!((first.id.as_str(), first.status), ("c", Status::Pending));
    assert_eq!(first.route, ["a", "b"]);
    assert_eq!(first.tool.as_deref(), Some("t"));
    let mut again = rec("c", None);
    again.tool = Some("other".into());
    again.status = Status::Running;
    let stored = b.create(&again).await.unwrap();
    assert_eq!(
        stored.tool.as_deref(),
        Some("t"),
        "an existing id is left as it is"
    );
    assert_eq!(stored.status, Status::Pending);
    assert_eq!(b.get("c").await.unwrap(), Some(stored));
}

async fn progress_never_goes_back<B: Backend>(b: &B) {
    b.create(&rec("p", None)).await.unwrap();
    let r = progress(b, "p", &prog("b", "completed", 1)).await.unwrap();
    assert_eq!((r.status, r.progress), (Status::Running, 99.0));
    assert_eq!(r.actor.as_deref(), Some("b"));
    let r = progress(b, "p", &prog("a", "received", 0)).await.unwrap();
    assert_eq!(r.progress, 99.0, "never goes back");
    assert_eq!(r.status, Status::Running);
    assert_eq!(b.get("p").await.unwrap().map(|r| r.progress), Some(99.0));
}

async fn first_final_wins<B: Backend>(b: &B) {
    b.create(&rec("f", None)).await.unwrap();
    progress(b, "f", &prog("a", "received", 0)).await.unwrap();
    let won = fin(Status::Succeeded, Some("x-sink"), Some(json!(1)), None);
    let (r, changed) = finish(b, "f", &won).await.unwrap();
    assert!(changed);
    assert_eq!((r.status, r.progress), (Status::Succeeded, 100.0));
    assert_eq!(
        (r.actor.as_deref(), r.result.clone()),
        (Some("x-sink"), Some(json!(1)))
    );
    let late = fin(Status::Failed, None, None, Some(json!("late")));
    let (r, changed) = finish(b, "f", &late).await.unwrap();
    assert!(!changed, "the first final status wins");
    assert_eq!(r.status, Status::Succeeded);
    assert_eq!((r.result, r.error), (Some(json!(1)), None));
    // Progress after the end changes nothing either.
    let r = progress(b, "f", &prog("b", "processing", 1)).await.unwrap();
    assert_eq!((r.status, r.progress), (Status::Succeeded, 100.0));
    assert_eq!(r.actor.as_deref(), Some("x-sink"));
    let phases: Vec<String> = b
        .events("f")
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.phase)
        .collect();
    assert_eq!(
        phases,
        ["received", "succeeded", "processing"],
        "the late final is not history"
    );
}

async fn unknown_ids<B: Backend>(b: &B) {
    assert_eq!(b.get("nope").await.unwrap(), None);
    assert!(
        progress(b, "nope", &prog("a", "received", 0))
            .await
            .is_none()
    );
    let f = fin(Status::Failed, None, None, None);
    assert!(finish(b, "nope", &f).await.is_none());
    assert!(b.events("nope").await.unwrap().is_empty());
    assert!(b.children("nope").await.unwrap().is_empty());
}

async fn children_and_history<B: Backend>(b: &B) {
    b.create(&rec("h", None)).await.unwrap();
    b.create(&rec("h-2", Some("h"))).await.unwrap();
    b.create(&rec("h-1", Some("h"))).await.unwrap();
    assert_eq!(b.children("h").await.unwrap(), ["h-1", "h-2"], "sorted");
    let mut p = prog("a", "received", 0);
    p.message = Some("hello".into());
    progress(b, "h", &p).await.unwrap();
    progress(b, "h", &prog("a", "completed", 0)).await.unwrap();
    let f = fin(Status::Failed, None, None, Some(json!({"reason": "boom"})));
    let (r, _) = finish(b, "h", &f).await.unwrap();
    assert_eq!(
        r.actor.as_deref(),
        Some("a"),
        "a final without an actor keeps the last"
    );
    assert_eq!(r.error, Some(json!({"reason": "boom"})));
    let history = b.events("h").await.unwrap();
    let seen: Vec<(&str, f64, Option<&str>)> = history
        .iter()
        .map(|e| (e.phase.as_str(), e.progress, e.message.as_deref()))
        .collect();
    assert_eq!(
        seen,
        [
            ("received", 5.0, Some("hello")),
            ("completed", 50.0, None),
            ("failed", 100.0, None)
        ]
    );
    assert_eq!(history[0].actor.as_deref(), Some("a"));
    assert_eq!(history[2].actor, None);
}

/// The namespace decides who may report and read (`crate::access`): it is stored as given,
/// never changed by a later create, progress or final status, and may be absent (envelopes
/// stored before it was recorded).
async fn namespace_is_kept<B: Backend>(b: &B) {
    let first = b.create(&rec("n", None)).await.unwrap();
    assert_eq!(first.namespace.as_deref(), Some("team"));
    let mut other = rec("n", None);
    other.namespace = Some("team-a".into());
    let stored = b.create(&other).await.unwrap();
    assert_eq!(
        stored.namespace.as_deref(),
        Some("team"),
        "a create cannot move an envelope to another namespace"
    );
    let r = progress(b, "n", &prog("a", "received", 0)).await.unwrap();
    assert_eq!(r.namespace.as_deref(), Some("team"));
    let (r, _) = finish(b, "n", &fin(Status::Succeeded, None, None, None))
        .await
        .unwrap();
    assert_eq!(r.namespace.as_deref(), Some("team"));
    let mut legacy = rec("n-legacy", None);
    legacy.namespace = None;
    b.create(&legacy).await.unwrap();
    assert_eq!(b.get("n-legacy").await.unwrap().unwrap().namespace, None);
}

/// The retention policy's statement (`crate::store::retention`): envelopes go with their
/// history once their final status, or (never finished) their creation, is older than its
/// cut-off; never one newer; at most `limit` of each kind per call.
async fn retention_deletes_by_age_in_bounded_batches<B: Backend>(b: &B) {
    assert_eq!(b.oldest_ms().await.unwrap(), None, "an empty store");
    let before = now_ms();
    for id in ["r-done-1", "r-done-2", "r-open-1", "r-open-2"] {
        b.create(&rec(id, None)).await.unwrap();
    }
    b.create(&rec("r-child", Some("r-done-1"))).await.unwrap();
    progress(b, "r-done-1", &prog("a", "received", 0)).await;
    progress(b, "r-open-1", &prog("a", "received", 0)).await;
    for id in ["r-done-1", "r-done-2", "r-child"] {
        finish(b, id, &fin(Status::Succeeded, None, None, None)).await;
    }
    let oldest = b.oldest_ms().await.unwrap().expect("the oldest");
    assert!(
        oldest >= before - 1000 && oldest <= now_ms() + 1000,
        "{oldest}"
    );

    // Cut-offs in the past: nothing is old enough; none given: nothing is looked at.
    let past = Some(before - 3_600_000);
    assert_eq!(b.expire(past, past, 100).await.unwrap(), 0);
    let future = Some(now_ms() + 60_000);
    assert_eq!(b.expire(None, None, 100).await.unwrap(), 0);
    assert_eq!(
        b.get("r-done-1").await.unwrap().map(|r| r.id).as_deref(),
        Some("r-done-1")
    );

    // The finished ones, at most two per call: the unfinished stay whatever their age.
    assert_eq!(
        b.expire(future, None, 2).await.unwrap(),
        2,
        "a bounded batch"
    );
    assert_eq!(b.expire(future, None, 2).await.unwrap(), 1);
    assert_eq!(b.expire(future, None, 2).await.unwrap(), 0);
    for id in ["r-done-1", "r-done-2", "r-child"] {
        assert_eq!(b.get(id).await.unwrap(), None, "{id}");
        assert!(
            b.events(id).await.unwrap().is_empty(),
            "{id}'s history went with it"
        );
    }
    assert!(b.children("r-done-1").await.unwrap().is_empty());
    assert!(b.get("r-open-1").await.unwrap().is_some());
    assert_eq!(b.events("r-open-1").await.unwrap().len(), 1);

    // The unfinished, once created before their cut-off.
    assert_eq!(b.expire(past, future, 1).await.unwrap(), 1);
    assert_eq!(b.expire(past, future, 100).await.unwrap(), 1);
    assert_eq!(b.get("r-open-1").await.unwrap(), None);
    assert!(b.events("r-open-1").await.unwrap().is_empty());
    assert_eq!(b.oldest_ms().await.unwrap(), None, "nothing left");
}

#[tokio::test]
async fn memory_conforms() {
    suite(&Memory::default()).await;
}

#[tokio::test]
async fn postgres_conforms() {
    let Ok(base) = std::env::var("ASYA_TEST_POSTGRES_URL") else {
        eprintln!(
            "SKIPPED postgres_conforms: ASYA_TEST_POSTGRES_URL is not set. It needs the test \
             PostgreSQL: tests/services/up, then `source tests/services/env` (or run `make unit`)."
        );
        return;
    };
    let db = scratch::Database::create(&base).await;
    let pg = Postgres::connect(&db.url)
        .await
        .expect("connect to the scratch database");
    suite(&pg).await;
    drop(pg);
    db.drop_now().await;
}

/// A database of the test's own on the test server, dropped at the end.
pub(crate) mod scratch {
    use tokio_postgres::NoTls;

    pub struct Database {
        base: String,
        name: String,
        pub url: String,
    }

    async fn admin(base: &str, sql: &str) {
        let (client, conn) = tokio_postgres::connect(base, NoTls)
            .await
            .unwrap_or_else(|e| panic!("ASYA_TEST_POSTGRES_URL is set but unreachable: {e}"));
        tokio::spawn(conn);
        client.batch_execute(sql).await.unwrap();
    }

    impl Database {
        pub async fn create(base: &str) -> Database {
            let name = format!("gw_conf_{}", uuid::Uuid::new_v4().simple());
            admin(base, &format!("CREATE DATABASE {name}")).await;
            let url = match base.rsplit_once('/') {
                Some((server, _)) => format!("{server}/{name}"),
                None => panic!("ASYA_TEST_POSTGRES_URL {base:?} names no database"),
            };
            Database {
                base: base.to_string(),
                name,
                url,
            }
        }

        pub async fn drop_now(self) {
            admin(
                &self.base,
                // One statement: several in one batch run as a transaction block, where DROP
                // DATABASE is refused; FORCE ends the connections still open to it.
                &format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name),
            )
            .await;
        }
    }
}
