//! Admission benchmark: throughput and latency over TLS keep-alive, HTTP/1.1 and h2, for
//! (a) validating an AsyncActor with three flavors, (b) injecting a realistic Deployment pod,
//! each against bare axum + rustls endpoints returning a fixed body (the ceilings: the
//! smallest review, and the webhook's own answer to that request); plus p99 at a fixed
//! 1,000 requests/s and memory with 10,000 AsyncActors in the reflector store.
//!
//! `cargo run --release -p asya-webhook --bin asya-webhook-bench [-- SECONDS CONNECTIONS]`
//! (default: 3 s for each figure, taken in turns with its ceilings; 4 connections; ~45 s).
//! Everything runs on loopback inside this process, bounded in time.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use asya_api::config::ClusterConfig;
use asya_api::flavor::{FlavorCatalog, FlavorDef, FlavorSource};
use asya_certs::{ReloadingResolver, ServingSpec, generate_ca, issue_serving};
use asya_webhook::cache::{ActorStore, CachedActor};
use asya_webhook::client::Conn;
use asya_webhook::server::{Shared, router, serve_tls};
use axum::routing::post;
use bytes::Bytes;
use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher::Event;
use serde_json::{Value, json};

const DAY: Duration = Duration::from_secs(86_400);

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

fn actor_obj(ns: &str, name: &str) -> Value {
    json!({
        "apiVersion": "asya.sh/v1alpha1", "kind": "AsyncActor",
        "metadata": {"name": name, "namespace": ns, "uid": format!("uid-{name}"), "resourceVersion": "12345",
                     "generation": 1, "labels": {"team": "ml", "app.kubernetes.io/part-of": "pipeline"},
                     "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {
            "actor": name, "transport": "rabbitmq", "image": "ghcr.io/acme/models/text-classifier:2.4.1",
            "handler": "classifier.handlers.Classifier.predict", "flavors": ["gpu-t4", "scale-fast", "retry-std"],
            "env": [{"name": "MODEL_PATH", "value": "/models/v2"}, {"name": "LOG_LEVEL", "value": "info"}],
            "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "4Gi"}},
            "resiliency": {"actorTimeout": "2m"}
        },
        "status": {"phase": "Running", "readyReplicas": 2, "queueIdentifier": format!("asya-{ns}-{name}")}
    })
}

fn catalog() -> FlavorCatalog {
    let mut c = FlavorCatalog::new();
    c.insert(FlavorDef::from_data("gpu-t4", FlavorSource::Flavor, &json!({
        "nodeSelector": {"nvidia.com/gpu.product": "Tesla-T4"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "resources": {"limits": {"nvidia.com/gpu": "1"}}
    })));
    c.insert(FlavorDef::from_data("scale-fast", FlavorSource::Flavor, &json!({
        "scaling": {"minReplicaCount": 1, "maxReplicaCount": 20, "queueLength": 2, "pollingInterval": 5}
    })));
    c.insert(FlavorDef::from_data("retry-std", FlavorSource::Flavor, &json!({
        "resiliency": {"policies": {"default": {"maxAttempts": 5, "backoff": "exponential", "initialInterval": "1s", "maxInterval": "30s"}},
                       "rules": [{"match": "TimeoutError", "policy": "default"}, {"match": "ValueError", "action": "fail"}]}
    })));
    c
}

fn review(kind: Value, object: Value) -> Bytes {
    Bytes::from(serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "kind": kind,
                    "resource": {"group": "", "version": "v1", "resource": "x"},
                    "name": object["metadata"]["name"].as_str().unwrap_or_default(), "namespace": "ml", "operation": "CREATE",
                    "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
                    "object": object, "dryRun": false}
    })).unwrap_or_default())
}

fn validate_body() -> Bytes {
    let mut a = actor_obj("ml", "text-classifier");
    a.as_object_mut().map(|o| o.remove("status"));
    review(
        json!({"group": "asya.sh", "version": "v1alpha1", "kind": "AsyncActor"}),
        a,
    )
}

fn pod_body() -> Bytes {
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"generateName": "text-classifier-7d9c6b5f4-", "namespace": "ml",
            "labels": {"asya.sh/inject": "true", "asya.sh/actor": "text-classifier", "app": "text-classifier",
                       "pod-template-hash": "7d9c6b5f4"},
            "annotations": {"asya.sh/sidecar-version": "0.1.0"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "text-classifier-7d9c6b5f4",
                                 "uid": "a1b2", "controller": true, "blockOwnerDeletion": true}]},
        "spec": {
            "serviceAccountName": "text-classifier",
            "nodeSelector": {"nvidia.com/gpu.product": "Tesla-T4"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{
                "name": "asya-runtime", "image": "ghcr.io/acme/models/text-classifier:2.4.1", "imagePullPolicy": "IfNotPresent",
                "env": [{"name": "MODEL_PATH", "value": "/models/v2"}, {"name": "LOG_LEVEL", "value": "info"},
                        {"name": "API_KEY", "valueFrom": {"secretKeyRef": {"name": "api-credentials", "key": "key"}}}],
                "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "4Gi", "nvidia.com/gpu": "1"}},
                "volumeMounts": [{"name": "models", "mountPath": "/models"},
                                 {"name": "kube-api-access-abcde", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": true}],
                "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File"
            }],
            "volumes": [{"name": "models", "persistentVolumeClaim": {"claimName": "models"}},
                        {"name": "kube-api-access-abcde", "projected": {"sources": [{"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}}]}}],
            "restartPolicy": "Always", "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst",
            "schedulerName": "default-scheduler", "enableServiceLinks": true, "priority": 0
        }
    });
    review(json!({"group": "", "version": "v1", "kind": "Pod"}), pod)
}

struct Figures {
    rps: f64,
    p50: Duration,
    p99: Duration,
    n: usize,
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// What every run shares: where the client connects and how.
struct Client<'a> {
    ca: &'a str,
    conns: usize,
    h2: bool,
}

/// Latencies and wall time of one or more runs, summed.
#[derive(Default)]
struct Sample {
    lat: Vec<Duration>,
    secs: f64,
}

impl Sample {
    fn add(&mut self, other: Sample) {
        self.lat.extend(other.lat);
        self.secs += other.secs;
    }

    fn figures(mut self) -> Figures {
        self.lat.sort();
        Figures {
            rps: self.lat.len() as f64 / self.secs.max(f64::EPSILON),
            p50: pct(&self.lat, 0.5),
            p99: pct(&self.lat, 0.99),
            n: self.lat.len(),
        }
    }
}

/// Closed loop: `conns` keep-alive connections, each sending back-to-back for `dur`.
/// `rate`: when set, open-loop pacing at that many requests/s in total.
async fn load(
    cl: &Client<'_>,
    addr: std::net::SocketAddr,
    path: &'static str,
    body: Bytes,
    dur: Duration,
    rate: Option<f64>,
) -> anyhow::Result<Sample> {
    let conns = cl.conns;
    let mut tasks = Vec::new();
    let start = Instant::now();
    for i in 0..conns {
        let mut c = Conn::connect(addr, "localhost", cl.ca, cl.h2).await?;
        let body = body.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(100_000);
            let interval = rate.map(|r| Duration::from_secs_f64(conns as f64 / r));
            // Stagger paced connections so the load is even.
            let mut next = start
                + interval
                    .map(|iv| iv.mul_f64(i as f64 / conns as f64))
                    .unwrap_or_default();
            while start.elapsed() < dur {
                if let Some(iv) = interval {
                    tokio::time::sleep_until(next.into()).await;
                    next += iv;
                }
                // Latency from the scheduled time in paced mode (no coordinated omission).
                let t0 = if interval.is_some() {
                    (next - interval.unwrap_or_default()).min(Instant::now())
                } else {
                    Instant::now()
                };
                let (status, _) = c.request("POST", path, body.clone()).await?;
                anyhow::ensure!(status == 200, "HTTP {status}");
                lat.push(t0.elapsed());
            }
            Ok::<_, anyhow::Error>(lat)
        }));
    }
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await??);
    }
    Ok(Sample {
        lat,
        secs: start.elapsed().as_secs_f64(),
    })
}

/// This VM's speed changes in phases of seconds, so the ceilings and the webhook are run in
/// turns of a fraction of `dur` each, and each one's turns are summed: all three see the
/// same phases.
const TURNS: u32 = 6;

fn show(name: &str, f: &Figures, ceiling: Option<f64>) {
    let share = ceiling
        .map(|c| format!("  {:5.1}% of the same-bytes ceiling", 100.0 * f.rps / c))
        .unwrap_or_default();
    println!(
        "{name:<40} {:>9.0} req/s   p50 {:>7.3} ms   p99 {:>7.3} ms   ({} requests){share}",
        f.rps,
        f.p50.as_secs_f64() * 1e3,
        f.p99.as_secs_f64() * 1e3,
        f.n
    );
}

async fn run() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let secs: u64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(3);
    let conns: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(4);
    let dur = Duration::from_secs(secs);
    let logic_only: Option<u32> = std::env::var("ASYA_BENCH_LOGIC_ONLY")
        .ok()
        .and_then(|v| v.parse().ok());

    let rss0 = rss_kib();
    // 10,000 AsyncActors in a real reflector store (the one the server reads).
    let mut writer = Writer::<CachedActor>::new(());
    let holders = Arc::new(asya_webhook::holders::HolderIndex::default());
    let t = Instant::now();
    for i in 0..10_000 {
        let ns = format!("team-{}", i % 50);
        // Through JSON text, as objects arrive from the API server.
        let text = serde_json::to_string(&actor_obj(&ns, &format!("actor-{i}")))?;
        let mut obj: CachedActor = serde_json::from_str(&text)?;
        obj.slim();
        let ev = Event::Apply(obj);
        writer.apply_watcher_event(&ev);
        holders.apply(&ev);
    }
    let pod_actor: CachedActor =
        serde_json::from_str(&serde_json::to_string(&actor_obj("ml", "text-classifier"))?)?;
    let ev = Event::Apply(pod_actor);
    writer.apply_watcher_event(&ev);
    holders.apply(&ev);
    let store = writer.as_reader();
    let rss1 = rss_kib();
    println!(
        "cache: {} AsyncActors loaded in {:.0} ms; RSS {:.1} MiB before, {:.1} MiB after ({:.1} MiB for the cache)",
        store.state().len(),
        t.elapsed().as_secs_f64() * 1e3,
        rss0 as f64 / 1024.0,
        rss1 as f64 / 1024.0,
        (rss1.saturating_sub(rss0)) as f64 / 1024.0
    );

    let now = SystemTime::now();
    let ca = generate_ca("bench CA", now, DAY)?;
    let srv = issue_serving(
        &ca,
        &ServingSpec::new(["localhost".to_string()], []),
        now,
        DAY,
    )?;
    let resolver = Arc::new(ReloadingResolver::new());
    resolver.set_pem(&srv.cert_pem, &srv.key_pem)?;

    let mut shared = Shared::fixed(
        ClusterConfig::default(),
        catalog(),
        Arc::new(ActorStore {
            store,
            holders,
            claims: asya_webhook::cache::no_claims(),
        }),
        resolver.clone(),
    );
    // Every connection's request in flight at once: the figures are the handler's, never a
    // shed request's.
    shared.limits = asya_webhook::server::Limits::new(
        conns.max(asya_webhook::server::DEFAULT_MAX_IN_FLIGHT),
        asya_webhook::server::DEFAULT_MAX_BODY,
    );
    let shared = Arc::new(shared);
    let l1 = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let webhook = l1.local_addr()?;
    tokio::spawn(serve_tls(
        l1,
        router(shared.clone()),
        resolver.clone(),
        std::future::pending(),
    ));

    let vbody = validate_body();
    let pbody = pod_body();
    // Sanity: the requests do what they claim before timing them. Their answers are also
    // what the ceilings return, so each ceiling moves the same bytes as its request.
    let mut c = Conn::connect(webhook, "localhost", &ca.cert_pem, false).await?;
    let (st, vresp) = c
        .request("POST", "/validate/asyncactors", vbody.clone())
        .await?;
    let v: Value = serde_json::from_slice(&vresp)
        .map_err(|e| anyhow::anyhow!("HTTP {st} {e}: {}", String::from_utf8_lossy(&vresp)))?;
    anyhow::ensure!(
        v["response"]["allowed"] == true,
        "validation not allowed: {v}"
    );
    let (st, presp) = c.request("POST", "/mutate/pods", pbody.clone()).await?;
    let v: Value = serde_json::from_slice(&presp)
        .map_err(|e| anyhow::anyhow!("HTTP {st} {e}: {}", String::from_utf8_lossy(&presp)))?;
    anyhow::ensure!(v["response"]["patch"].is_string(), "pod not patched: {v}");

    // The ceilings: the same TLS and HTTP stack, handlers that return a fixed body without
    // looking at the request. "minimal" returns the smallest allowed review (the original
    // ceiling); "same bytes" returns exactly the webhook's answer to that request, so the
    // only difference from the webhook is the admission logic.
    let minimal = Bytes::from_static(br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"705ab4f5-6393-11e8-b7cc-42010a800002","allowed":true}}"#);
    let fixed = |b: Bytes| {
        post(move |_b: Bytes| {
            let f = b.clone();
            async move { f }
        })
    };
    let bare = axum::Router::new()
        .route("/minimal", fixed(minimal))
        .route("/validate", fixed(vresp.clone()))
        .route("/inject", fixed(presp.clone()));
    let l2 = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let ceiling_addr = l2.local_addr()?;
    tokio::spawn(serve_tls(
        l2,
        bare,
        resolver.clone(),
        std::future::pending(),
    ));

    // `ASYA_BENCH_PROFILE=CASE`: only that case, below and in the logic loop (with
    // `ASYA_BENCH_LOGIC_ONLY`); the loop is skipped otherwise.
    let profile = std::env::var("ASYA_BENCH_PROFILE").ok();
    // Where the time goes: the admission logic alone, no TLS or HTTP, one core.
    if profile.is_none() || logic_only.is_some() {
        let catalog = shared.catalog();
        let ctx = asya_webhook::admission::Ctx {
            config: &shared.config,
            catalog: &catalog,
            actors: shared.actors.as_ref(),
            native_sidecar: true,
            memo: Some(&shared.settings_memo),
        };
        for (name, ep, body) in [
            (
                "validate",
                asya_webhook::admission::Endpoint::ValidateActors,
                &vbody,
            ),
            // What an AsyncActor costs with the chart's one webhook call.
            (
                "admit-actor",
                asya_webhook::admission::Endpoint::MutateActors,
                &vbody,
            ),
            (
                "inject",
                asya_webhook::admission::Endpoint::MutatePods,
                &pbody,
            ),
        ] {
            if profile.as_deref().is_some_and(|p| p != name) {
                continue;
            }
            // `ASYA_BENCH_LOGIC_ONLY=N`: N iterations each, then stop (for `perf record`).
            let n = logic_only.unwrap_or(4000).max(20);
            // In 20 batches: the median and the best batch say more than one mean on a
            // shared machine, where another process can take the core mid-batch.
            let mut per_batch = Vec::with_capacity(20);
            for _ in 0..20 {
                let t = Instant::now();
                for _ in 0..n / 20 {
                    let h = asya_webhook::admission::handle(ep, body, &ctx)
                        .map_err(|e| anyhow::anyhow!("{e}"))?;
                    std::hint::black_box(asya_webhook::admission::encode_review(&h.review)?);
                }
                per_batch.push(t.elapsed().as_secs_f64() * 1e6 / (n / 20) as f64);
            }
            per_batch.sort_by(f64::total_cmp);
            println!(
                "in-process handle+encode, {name}: median {:.1} µs, best batch {:.1} µs per request (one core)",
                per_batch[per_batch.len() / 2],
                per_batch[0]
            );
        }
    }
    if logic_only.is_some() {
        return Ok(());
    }
    // `ASYA_BENCH_PROFILE=validate|inject|ceiling-validate|ceiling-inject`: only that load,
    // HTTP/1.1, for SECONDS, then stop (for `perf record` under load).
    if let Some(case) = profile {
        let (addr, path, body) = match case.as_str() {
            "validate" => (webhook, "/validate/asyncactors", &vbody),
            "inject" => (webhook, "/mutate/pods", &pbody),
            "ceiling-validate" => (ceiling_addr, "/validate", &vbody),
            "ceiling-inject" => (ceiling_addr, "/inject", &pbody),
            other => anyhow::bail!(
                "ASYA_BENCH_PROFILE={other:?}: expected validate, inject, ceiling-validate or ceiling-inject"
            ),
        };
        let cl = Client {
            ca: &ca.cert_pem,
            conns,
            h2: false,
        };
        let f = load(&cl, addr, path, body.clone(), dur, None)
            .await?
            .figures();
        show(&format!("HTTP/1.1 {case}"), &f, None);
        return Ok(());
    }
    println!(
        "load: {conns} TLS keep-alive connections, {secs} s per figure in {TURNS} turns alternating with its ceilings; client and server share this machine's 2 cores"
    );
    println!(
        "request bodies: validate {} bytes, pod {} bytes; responses: validate {} bytes, pod {} bytes",
        vbody.len(),
        pbody.len(),
        vresp.len(),
        presp.len()
    );
    // HTTP/1.1 (what the API server uses for admission webhooks, so that its requests
    // spread over replicas: kubernetes/kubernetes#82090) and h2 (the server offers both).
    for h2 in [false, true] {
        let cl = Client {
            ca: &ca.cert_pem,
            conns,
            h2,
        };
        let proto = if h2 { "h2" } else { "HTTP/1.1" };
        for (name, path, ceil_path, body) in [
            (
                "validate AsyncActor (3 flavors)",
                "/validate/asyncactors",
                "/validate",
                &vbody,
            ),
            ("inject Deployment pod", "/mutate/pods", "/inject", &pbody),
        ] {
            let (mut minimal, mut same, mut hook) =
                (Sample::default(), Sample::default(), Sample::default());
            for _ in 0..TURNS {
                let turn = dur / TURNS;
                minimal.add(load(&cl, ceiling_addr, "/minimal", body.clone(), turn, None).await?);
                same.add(load(&cl, ceiling_addr, ceil_path, body.clone(), turn, None).await?);
                hook.add(load(&cl, webhook, path, body.clone(), turn, None).await?);
            }
            let (minimal, same, hook) = (minimal.figures(), same.figures(), hook.figures());
            show(&format!("{proto} ceiling, minimal body"), &minimal, None);
            show(&format!("{proto} ceiling, same bytes"), &same, None);
            show(&format!("{proto} {name}"), &hook, Some(same.rps));
            println!(
                "{:<40} {:>9} {:5.1}% of the minimal ceiling",
                "",
                "",
                100.0 * hook.rps / minimal.rps
            );
        }
    }
    let cl = Client {
        ca: &ca.cert_pem,
        conns,
        h2: false,
    };
    let v1k = load(
        &cl,
        webhook,
        "/validate/asyncactors",
        vbody,
        dur,
        Some(1000.0),
    )
    .await?;
    show("validate at 1,000 req/s (paced)", &v1k.figures(), None);
    let p1k = load(&cl, webhook, "/mutate/pods", pbody, dur, Some(1000.0)).await?;
    show("inject at 1,000 req/s (paced)", &p1k.figures(), None);
    println!(
        "RSS at end: {:.1} MiB (server, client and 10,000 cached AsyncActors in one process)",
        rss_kib() as f64 / 1024.0
    );
    Ok(())
}

fn main() -> std::process::ExitCode {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match rt.block_on(run()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("asya-webhook-bench: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
