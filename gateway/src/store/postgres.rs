//! PostgreSQL storage through tokio-postgres. Migrations are embedded and applied at start
//! under an advisory lock (several gateway replicas may start at once). Two connections, each
//! re-established on demand: calls and final statuses on one whose commits wait for the disk;
//! progress and reads on one whose commits do not (`synchronous_commit = off`: a crash of the
//! database may lose its last fraction of a second of progress, never a call or a final
//! status; the data stays consistent). With one connection for all, every progress report
//! waited for its own WAL flush behind the others, and that bounded a whole gateway to a few
//! hundred calls per second. Every statement has a deadline, so a hung database answers 503
//! instead of hanging the caller.

use std::time::Duration;

use serde_json::Value;
use std::sync::Arc;

use tokio::sync::Mutex;
use tokio::time::timeout;
use tokio_postgres::{Client, NoTls, Row};

use super::Backend;
use super::model::{
    Done, Event, Final, JoinRefused, JoinReply, JoinView, Progress, Record, Status, StoreError,
    after_branch,
};
use asya_transport::fanin::{BranchReport, JoinAnswer};

/// (version, SQL), applied in order, each once.
const MIGRATIONS: &[(i32, &str)] = &[
    (1, include_str!("../../migrations/0001_envelopes.sql")),
    (
        2,
        include_str!("../../migrations/0002_envelope_namespace.sql"),
    ),
    (
        3,
        include_str!("../../migrations/0003_envelope_retention.sql"),
    ),
    (4, include_str!("../../migrations/0004_fanin.sql")),
];

const DEADLINE: Duration = Duration::from_secs(5);

/// One connection, opened on first use and again after it failed.
struct Conn {
    client: Mutex<Option<Arc<Client>>>,
    /// Run once on every new connection: its commit mode.
    setup: &'static str,
}

impl Conn {
    fn new(setup: &'static str) -> Conn {
        Conn {
            client: Mutex::new(None),
            setup,
        }
    }
}

pub struct Postgres {
    url: String,
    /// Calls (envelopes created) and final statuses.
    durable: Conn,
    /// Progress events and reads.
    advisory: Conn,
    /// The retention policy's deletes, on a connection of their own so that a batch never
    /// holds up the statements of calls and reports queued behind it.
    maintenance: Conn,
    /// Fan-in transactions: a connection of their own, held for the whole transaction (a
    /// shared, pipelined connection would mix other statements into it); durable commits.
    fanin: Mutex<Option<Client>>,
}

fn down(e: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(e.to_string())
}

const COLUMNS: &str = "id, parent_id, tool, status, progress, actor, route, result, error, \
     (extract(epoch from created_at) * 1000)::bigint, (extract(epoch from updated_at) * 1000)::bigint, \
     namespace";

fn record(row: &Row) -> Result<Record, StoreError> {
    let status: String = row.try_get(3).map_err(down)?;
    let route: Value = row.try_get(6).map_err(down)?;
    Ok(Record {
        id: row.try_get(0).map_err(down)?,
        parent_id: row.try_get(1).map_err(down)?,
        tool: row.try_get(2).map_err(down)?,
        status: Status::parse(&status)
            .ok_or_else(|| StoreError::Rejected(format!("unknown status {status:?} stored")))?,
        progress: row.try_get(4).map_err(down)?,
        actor: row.try_get(5).map_err(down)?,
        route: serde_json::from_value(route).unwrap_or_default(),
        result: row.try_get(7).map_err(down)?,
        error: row.try_get(8).map_err(down)?,
        created_ms: row.try_get(9).map_err(down)?,
        updated_ms: row.try_get(10).map_err(down)?,
        namespace: row.try_get(11).map_err(down)?,
    })
}

impl Postgres {
    /// Connects and applies the migrations; fails when the database cannot be reached.
    pub async fn connect(url: &str) -> Result<Postgres, StoreError> {
        let pg = Postgres {
            url: url.to_string(),
            durable: Conn::new("SET synchronous_commit TO on"),
            advisory: Conn::new("SET synchronous_commit TO off"),
            maintenance: Conn::new("SET synchronous_commit TO off"),
            fanin: Mutex::new(None),
        };
        pg.migrate().await?;
        Ok(pg)
    }

    async fn open(&self, setup: &str) -> Result<Client, StoreError> {
        let (client, connection) =
            tokio::time::timeout(DEADLINE, tokio_postgres::connect(&self.url, NoTls))
                .await
                .map_err(|_| down("connect timed out"))?
                .map_err(down)?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::warn!(error = %e, "PostgreSQL connection ended");
            }
        });
        tokio::time::timeout(DEADLINE, client.batch_execute(setup))
            .await
            .map_err(|_| down("connection setup timed out"))?
            .map_err(down)?;
        Ok(client)
    }

    /// A live connection (shared: tokio-postgres pipelines concurrent statements).
    async fn client(&self, conn: &Conn) -> Result<Arc<Client>, StoreError> {
        let mut guard = conn.client.lock().await;
        if let Some(c) = guard.as_ref()
            && !c.is_closed()
        {
            return Ok(c.clone());
        }
        let c = Arc::new(self.open(conn.setup).await?);
        *guard = Some(c.clone());
        Ok(c)
    }

    /// The outcome of one statement run under the deadline; a connection that failed or
    /// hung is dropped so the next statement reconnects.
    async fn done<T>(
        conn: &Conn,
        r: Result<Result<T, tokio_postgres::Error>, tokio::time::error::Elapsed>,
    ) -> Result<T, StoreError> {
        match r {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) if e.as_db_error().is_some() && !e.is_closed() => {
                Err(StoreError::Rejected(e.to_string()))
            }
            Ok(Err(e)) => {
                *conn.client.lock().await = None;
                Err(down(e))
            }
            Err(_) => {
                *conn.client.lock().await = None;
                Err(down("statement timed out"))
            }
        }
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        let mut client = self.open(self.durable.setup).await?;
        let tx = client.transaction().await.map_err(down)?;
        // Serialises concurrent starts; released at commit.
        tx.execute("SELECT pg_advisory_xact_lock(8127364519)", &[])
            .await
            .map_err(down)?;
        tx.batch_execute(
            "CREATE TABLE IF NOT EXISTS asya_gateway_migrations (
                 version integer PRIMARY KEY,
                 applied_at timestamptz NOT NULL DEFAULT now())",
        )
        .await
        .map_err(down)?;
        for (version, sql) in MIGRATIONS {
            let done = tx
                .query_opt(
                    "SELECT 1 FROM asya_gateway_migrations WHERE version = $1",
                    &[version],
                )
                .await
                .map_err(down)?
                .is_some();
            if done {
                continue;
            }
            tx.batch_execute(sql)
                .await
                .map_err(|e| StoreError::Rejected(format!("migration {version}: {e}")))?;
            tx.execute(
                "INSERT INTO asya_gateway_migrations (version) VALUES ($1)",
                &[version],
            )
            .await
            .map_err(down)?;
            tracing::info!(version, "applied database migration");
        }
        tx.commit().await.map_err(down)?;
        *self.durable.client.lock().await = Some(Arc::new(client));
        Ok(())
    }
}

impl Backend for Postgres {
    fn kind(&self) -> &'static str {
        "postgres"
    }

    async fn ping(&self) -> Result<(), StoreError> {
        let c = self.client(&self.durable).await?;
        let r = timeout(DEADLINE, c.simple_query("SELECT 1")).await;
        Self::done(&self.durable, r).await.map(|_| ())
    }

    async fn create(&self, r: &Record) -> Result<Record, StoreError> {
        let route = serde_json::to_value(&r.route).unwrap_or(Value::Null);
        let sql = format!(
            "INSERT INTO envelopes (id, parent_id, tool, status, progress, actor, route, result, error, namespace)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
             ON CONFLICT (id) DO UPDATE SET id = EXCLUDED.id
             RETURNING {COLUMNS}"
        );
        let status = r.status.as_str();
        let c = self.client(&self.durable).await?;
        let r = timeout(
            DEADLINE,
            c.query_one(
                &sql,
                &[
                    &r.id,
                    &r.parent_id,
                    &r.tool,
                    &status,
                    &r.progress,
                    &r.actor,
                    &route,
                    &r.result,
                    &r.error,
                    &r.namespace,
                ],
            ),
        )
        .await;
        let row = Self::done(&self.durable, r).await?;
        record(&row)
    }

    async fn get(&self, id: &str) -> Result<Option<Record>, StoreError> {
        let sql = format!("SELECT {COLUMNS} FROM envelopes WHERE id = $1");
        let c = self.client(&self.advisory).await?;
        let r = timeout(DEADLINE, c.query_opt(&sql, &[&id])).await;
        let row = Self::done(&self.advisory, r).await?;
        row.as_ref().map(record).transpose()
    }

    async fn children(&self, id: &str) -> Result<Vec<String>, StoreError> {
        let c = self.client(&self.advisory).await?;
        let r = timeout(
            DEADLINE,
            c.query(
                "SELECT id FROM envelopes WHERE parent_id = $1 ORDER BY id",
                &[&id],
            ),
        )
        .await;
        let rows = Self::done(&self.advisory, r).await?;
        rows.iter().map(|r| r.try_get(0).map_err(down)).collect()
    }

    async fn events(&self, id: &str) -> Result<Vec<Event>, StoreError> {
        let c = self.client(&self.advisory).await?;
        let r = timeout(
            DEADLINE,
            c.query(
                "SELECT actor, phase, progress, message, (extract(epoch from at) * 1000)::bigint
                 FROM envelope_events WHERE envelope_id = $1 ORDER BY seq",
                &[&id],
            ),
        )
        .await;
        let rows = Self::done(&self.advisory, r).await?;
        rows.iter()
            .map(|r| {
                Ok(Event {
                    actor: r.try_get(0).map_err(down)?,
                    phase: r.try_get(1).map_err(down)?,
                    progress: r.try_get(2).map_err(down)?,
                    message: r.try_get(3).map_err(down)?,
                    at_ms: r.try_get(4).map_err(down)?,
                })
            })
            .collect()
    }

    /// Progress never goes back and never changes a final status.
    async fn progress(
        &self,
        id: &str,
        p: &Progress,
        event: &Event,
    ) -> Result<Option<Record>, StoreError> {
        let sql = format!(
            "WITH upd AS (
               UPDATE envelopes SET
                 status = CASE WHEN status IN ('succeeded', 'failed') THEN status ELSE 'running' END,
                 actor = CASE WHEN status IN ('succeeded', 'failed') THEN actor ELSE $2 END,
                 progress = CASE WHEN status IN ('succeeded', 'failed') THEN progress ELSE GREATEST(progress, $3) END,
                 updated_at = now()
               WHERE id = $1 RETURNING {COLUMNS}
             ), ev AS (
               INSERT INTO envelope_events (envelope_id, actor, phase, progress, message)
               SELECT $1, $2, $4, $3, $5 FROM upd
             )
             SELECT * FROM upd"
        );
        let percent = event.progress;
        let c = self.client(&self.advisory).await?;
        let r = timeout(
            DEADLINE,
            c.query_opt(&sql, &[&id, &p.actor, &percent, &p.phase, &p.message]),
        )
        .await;
        let row = Self::done(&self.advisory, r).await?;
        row.as_ref().map(record).transpose()
    }

    /// Returns the record and whether this call set the final status.
    async fn finish(
        &self,
        id: &str,
        f: &Final,
        _event: &Event,
    ) -> Result<Option<(Record, bool)>, StoreError> {
        let sql = format!(
            "WITH upd AS (
               UPDATE envelopes SET status = $2, progress = 100, actor = COALESCE($3, actor),
                 result = $4, error = $5, updated_at = now(), finished_at = now()
               WHERE id = $1 AND status NOT IN ('succeeded', 'failed') RETURNING {COLUMNS}
             ), ev AS (
               INSERT INTO envelope_events (envelope_id, actor, phase, progress)
               SELECT $1, $3, $2, 100 FROM upd
             )
             SELECT * FROM upd"
        );
        // The event is written by the statement (the same actor, status and 100).
        let st = f.status.as_str();
        let c = self.client(&self.durable).await?;
        let r = timeout(
            DEADLINE,
            c.query_opt(&sql, &[&id, &st, &f.actor, &f.result, &f.error]),
        )
        .await;
        let row = Self::done(&self.durable, r).await?;
        match row {
            Some(r) => Ok(Some((record(&r)?, true))),
            None => Ok(self.get(id).await?.map(|r| (r, false))),
        }
    }

    /// Two bounded selects, oldest first, by the indexes of migration 3; rows another
    /// replica's pass holds are skipped rather than waited for. Events go by the foreign
    /// key's cascade.
    async fn expire(
        &self,
        finished_before_ms: Option<i64>,
        unfinished_before_ms: Option<i64>,
        limit: u32,
    ) -> Result<u64, StoreError> {
        let sql = "WITH f AS (
               SELECT id FROM envelopes WHERE finished_at < to_timestamp($1::bigint / 1000.0)
               ORDER BY finished_at LIMIT $3 FOR UPDATE SKIP LOCKED
             ), u AS (
               SELECT id FROM envelopes
               WHERE finished_at IS NULL AND created_at < to_timestamp($2::bigint / 1000.0)
               ORDER BY created_at LIMIT $3 FOR UPDATE SKIP LOCKED
             )
             DELETE FROM envelopes WHERE id IN (SELECT id FROM f UNION SELECT id FROM u)";
        let limit = i64::from(limit);
        let c = self.client(&self.maintenance).await?;
        let r = timeout(
            DEADLINE,
            c.execute(sql, &[&finished_before_ms, &unfinished_before_ms, &limit]),
        )
        .await;
        Self::done(&self.maintenance, r).await
    }

    async fn oldest_ms(&self) -> Result<Option<i64>, StoreError> {
        let c = self.client(&self.maintenance).await?;
        let r = timeout(
            DEADLINE,
            c.query_one(
                "SELECT (extract(epoch from min(created_at)) * 1000)::bigint FROM envelopes",
                &[],
            ),
        )
        .await;
        let row = Self::done(&self.maintenance, r).await?;
        row.try_get(0).map_err(down)
    }

    async fn expire_joins(
        &self,
        finished_before_ms: Option<i64>,
        unfinished_before_ms: Option<i64>,
        limit: u32,
    ) -> Result<u64, StoreError> {
        let limit = i64::from(limit);
        let c = self.client(&self.maintenance).await?;
        let r = timeout(
            DEADLINE,
            c.execute(
                EXPIRE_JOINS,
                &[&finished_before_ms, &unfinished_before_ms, &limit],
            ),
        )
        .await;
        Self::done(&self.maintenance, r).await
    }

    async fn branch(
        &self,
        namespace: &str,
        join: &str,
        index: u32,
        report: &BranchReport,
    ) -> Result<Result<JoinAnswer, JoinRefused>, StoreError> {
        let mut guard = self.fanin.lock().await;
        if guard.as_ref().is_none_or(|c| c.is_closed()) {
            *guard = Some(self.open("SET synchronous_commit TO on").await?);
        }
        let Some(client) = guard.as_mut() else {
            return Err(down("no fan-in connection"));
        };
        let r = timeout(DEADLINE, branch_tx(client, namespace, join, index, report)).await;
        match r {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(e)) if e.as_db_error().is_some() && !e.is_closed() => {
                Err(StoreError::Rejected(e.to_string()))
            }
            Ok(Err(e)) => {
                *guard = None;
                Err(down(e))
            }
            Err(_) => {
                // The transaction may still be open on it: a new connection for the next.
                *guard = None;
                Err(down("fan-in transaction timed out"))
            }
        }
    }
}

/// Fan-ins by age, as envelopes (migration 4's indexes); branches go by the cascade.
const EXPIRE_JOINS: &str = "WITH f AS (
       SELECT namespace, join_id FROM fanin_joins
       WHERE finished_at < to_timestamp($1::bigint / 1000.0)
       ORDER BY finished_at LIMIT $3 FOR UPDATE SKIP LOCKED
     ), u AS (
       SELECT namespace, join_id FROM fanin_joins
       WHERE finished_at IS NULL AND created_at < to_timestamp($2::bigint / 1000.0)
       ORDER BY created_at LIMIT $3 FOR UPDATE SKIP LOCKED
     )
     DELETE FROM fanin_joins j USING (SELECT * FROM f UNION SELECT * FROM u) d
     WHERE j.namespace = d.namespace AND j.join_id = d.join_id";

/// One branch report in one transaction: the join's row locked (`FOR UPDATE`) so reports of
/// the same join are decided one after the other, the rule applied, the branch inserted and
/// the join marked done together. A refusal rolls back (the transaction is dropped).
async fn branch_tx(
    client: &mut Client,
    namespace: &str,
    join: &str,
    index: u32,
    report: &BranchReport,
) -> Result<Result<JoinAnswer, JoinRefused>, tokio_postgres::Error> {
    let tx = client.transaction().await?;
    let total = report.total as i32;
    let idx = index as i32;
    tx.execute(
        "INSERT INTO fanin_joins (namespace, join_id, total) VALUES ($1, $2, $3)
         ON CONFLICT (namespace, join_id) DO NOTHING",
        &[&namespace, &join, &total],
    )
    .await?;
    let row = tx
        .query_one(
            "SELECT total, done_by, failed FROM fanin_joins
             WHERE namespace = $1 AND join_id = $2 FOR UPDATE",
            &[&namespace, &join],
        )
        .await?;
    let stored_total: i32 = row.try_get(0)?;
    let done_by: Option<i32> = row.try_get(1)?;
    let failed: bool = row.try_get(2)?;
    let stored = tx
        .query(
            "SELECT idx FROM fanin_branches WHERE namespace = $1 AND join_id = $2",
            &[&namespace, &join],
        )
        .await?
        .iter()
        .map(|r| r.try_get::<_, i32>(0).map(|i| i as u32))
        .collect::<Result<_, _>>()?;
    let view = JoinView {
        total: stored_total as u32,
        stored,
        done: done_by.map(|by| Done {
            by: by as u32,
            failed,
        }),
    };
    let step = match after_branch(join, &view, index, report.total, report.error.is_some()) {
        Ok(s) => s,
        Err(r) => return Ok(Err(r)),
    };
    if step.insert {
        tx.execute(
            "INSERT INTO fanin_branches (namespace, join_id, idx, result, error)
             VALUES ($1, $2, $3, $4, $5)",
            &[&namespace, &join, &idx, &report.result, &report.error],
        )
        .await?;
    }
    if let Some(done) = step.fire {
        tx.execute(
            "UPDATE fanin_joins SET done_by = $3, failed = $4, finished_at = now()
             WHERE namespace = $1 AND join_id = $2",
            &[&namespace, &join, &(done.by as i32), &done.failed],
        )
        .await?;
    }
    let answer = match step.reply {
        JoinReply::Waiting { stored, total } => JoinAnswer::Waiting { stored, total },
        JoinReply::Joined => JoinAnswer::Joined,
        JoinReply::Complete => {
            let rows = tx
                .query(
                    "SELECT result FROM fanin_branches WHERE namespace = $1 AND join_id = $2
                     ORDER BY idx",
                    &[&namespace, &join],
                )
                .await?;
            let results = rows
                .iter()
                .map(|r| {
                    r.try_get::<_, Option<Value>>(0)
                        .map(|v| v.unwrap_or(Value::Null))
                })
                .collect::<Result<_, _>>()?;
            JoinAnswer::Complete { results }
        }
        JoinReply::Failed { index } => {
            let row = tx
                .query_opt(
                    "SELECT error FROM fanin_branches
                     WHERE namespace = $1 AND join_id = $2 AND idx = $3",
                    &[&namespace, &join, &(index as i32)],
                )
                .await?;
            let error = match row {
                Some(r) => r.try_get::<_, Option<Value>>(0)?,
                None => None,
            };
            JoinAnswer::Failed {
                index,
                error: error.unwrap_or(Value::Null),
            }
        }
    };
    tx.commit().await?;
    Ok(Ok(answer))
}
