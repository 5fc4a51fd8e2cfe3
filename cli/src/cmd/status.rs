//! `asya status [ACTOR]`: `kubectl get asyas -o wide` and the conditions behind a phase.

use crate::args::Global;
use crate::cluster::{self, Where};
use crate::error::{CliError, Exit, Result};
use crate::render::{self, Format};
use crate::views;

pub async fn run(g: &Global, actor: Option<&str>) -> Result<(String, Exit)> {
    // Status needs the API server only: no release configuration, no broker.
    let c = cluster::connect(&Where {
        kubeconfig: g.kubeconfig.clone(),
        context: g.context.clone(),
        namespace: g.namespace.clone(),
    })
    .await?;
    let actors = cluster::actors(&c.client, Some(&c.namespace)).await?;
    let rows: Vec<_> = actors
        .iter()
        .filter(|a| {
            actor.is_none_or(|n| {
                a.metadata.name.as_deref() == Some(n) || a.spec.actor.as_deref() == Some(n)
            })
        })
        .map(views::status_row)
        .collect();
    if let Some(n) = actor
        && rows.is_empty()
    {
        return Err(CliError::NotFound {
            what: format!("AsyncActor {n:?} in namespace {:?}", c.namespace),
            why: "no actor of that name or actor name".into(),
        });
    }
    let out = match g.output {
        Format::Table => views::status_table(&rows),
        f => render::structured(&rows, f),
    };
    Ok((out, Exit::Ok))
}
