//! Who may do what at the gateway (`access`): token kinds on their routes, limited clients
//! to their tools and namespaces, report tokens to their namespace's envelopes, children only
//! under a known parent, a report token of a namespace made again refused.

use super::*;

fn only(v: &[&str]) -> Scope {
    Scope::Only(v.iter().map(|s| s.to_string()).collect())
}

fn client(tools: Scope, namespaces: Scope) -> Principal {
    Principal::Client(ClientGrant { tools, namespaces })
}

fn reporter(ns: &str) -> Principal {
    Principal::Reporter {
        namespace: ns.into(),
    }
}

#[test]
fn token_kinds_keep_to_their_routes() {
    let any = client(Scope::All, Scope::All);
    assert_eq!(client_route(&any, "GET /tools"), Ok(()));
    assert_eq!(client_route(&Principal::Open, "GET /tools"), Ok(()));
    let e = client_route(&reporter("team"), "POST /tools/call").unwrap_err();
    assert_eq!(e.code(), "report_token_not_allowed");
    assert!(!e.is_hidden());
    assert_eq!(
        e.to_string(),
        "POST /tools/call: a report token (namespace \"team\") may only report progress, \
         fan-out children and final statuses of its namespace's envelopes; calling tools and \
         reading envelopes need a client token"
    );
    assert_eq!(report_route(&reporter("team"), "POST /envelopes"), Ok(()));
    assert_eq!(report_route(&Principal::Open, "POST /envelopes"), Ok(()));
    let e = report_route(&any, "POST /envelopes").unwrap_err();
    assert_eq!(e.code(), "client_token_not_allowed");
    assert!(
        e.to_string().contains("only report tokens may report"),
        "{e}"
    );
}

#[test]
fn limited_clients_call_only_their_tools_in_their_namespaces() {
    let any = client(Scope::All, Scope::All);
    assert_eq!(may_call(&any, "t", "team"), Ok(()));
    assert_eq!(may_call(&Principal::Open, "t", "team"), Ok(()));
    let tools = client(only(&["a", "b"]), Scope::All);
    assert_eq!(may_call(&tools, "a", "anywhere"), Ok(()));
    let e = may_call(&tools, "c", "team").unwrap_err();
    assert_eq!(
        (e.code(), e.to_string().as_str()),
        (
            "tool_not_allowed",
            "tool \"c\": this token may call only the tools a, b"
        )
    );
    let ns = client(Scope::All, only(&["team-a"]));
    assert_eq!(may_call(&ns, "t", "team-a"), Ok(()));
    let e = may_call(&ns, "t", "team").unwrap_err();
    assert_eq!(
        (e.code(), e.to_string().as_str()),
        (
            "namespace_not_allowed",
            "tool \"t\" runs in namespace \"team\": this token may use only the namespaces team-a"
        )
    );
    assert!(lists_tool(&ns, "t", "team-a"));
    assert!(!lists_tool(&ns, "t", "team"));
    assert!(!lists_tool(&reporter("team-a"), "t", "team-a"));
    assert_eq!(
        may_call(&reporter("team"), "t", "team").unwrap_err().code(),
        "report_token_not_allowed"
    );
}

#[test]
fn a_limited_client_reads_only_its_namespaces_and_cannot_tell_others_from_missing() {
    let any = client(Scope::All, Scope::All);
    assert_eq!(may_read(&any, "e", Some("team")), Ok(()));
    assert_eq!(may_read(&any, "e", None), Ok(()));
    let ns = client(only(&["x"]), only(&["team-a", "team-b"]));
    assert_eq!(may_read(&ns, "e", Some("team-b")), Ok(()));
    for other in [Some("team"), None] {
        let e = may_read(&ns, "e", other).unwrap_err();
        assert!(e.is_hidden(), "{e}");
        assert_eq!(e.code(), "unknown_envelope", "as an unknown id");
        assert_eq!(
            e.to_string(),
            "no envelope with id \"e\" in the namespaces this token may read (team-a, team-b)"
        );
    }
    let e = may_read(&reporter("team"), "e", Some("team")).unwrap_err();
    assert_eq!(e.code(), "report_token_not_allowed");
}

#[test]
fn a_report_token_reports_only_its_namespaces_envelopes() {
    let r = reporter("team");
    assert_eq!(may_report(&r, "e", Some("team")), Ok(()));
    assert_eq!(
        may_report(&r, "e", None),
        Ok(()),
        "stored before namespaces"
    );
    let e = may_report(&r, "e", Some("team-a")).unwrap_err();
    assert_eq!(e.code(), "envelope_of_another_namespace");
    assert!(!e.is_hidden());
    assert_eq!(
        e.to_string(),
        "envelope \"e\" belongs to namespace \"team-a\": the report token of namespace \"team\" \
         reports only envelopes of its own namespace"
    );
    assert_eq!(may_report(&Principal::Open, "e", Some("team-a")), Ok(()));
    let e = may_report(&client(Scope::All, Scope::All), "e", Some("team")).unwrap_err();
    assert_eq!(e.code(), "client_token_not_allowed");
}

#[test]
fn a_child_is_recorded_only_under_a_known_parent_of_the_reporters_namespace() {
    let r = reporter("team");
    assert_eq!(
        child_namespace(&r, "p", Some(Some("team"))),
        Ok(Some("team".into()))
    );
    // Unknown, and another namespace's: the same refusal, in the same words.
    let unknown = child_namespace(&r, "p", None).unwrap_err();
    let theirs = child_namespace(&r, "p", Some(Some("team-a"))).unwrap_err();
    assert_eq!(unknown, theirs);
    assert_eq!(
        unknown.to_string(),
        "parent_id \"p\": no such envelope in this report token's namespace; a fan-out child is \
         recorded only under an envelope the gateway knows"
    );
    // A parent stored before namespaces were: the reporter's own.
    assert_eq!(
        child_namespace(&r, "p", Some(None)),
        Ok(Some("team".into()))
    );
    // Authentication off: the parent must still exist.
    assert!(child_namespace(&Principal::Open, "p", None).is_err());
    assert_eq!(child_namespace(&Principal::Open, "p", Some(None)), Ok(None));
    assert_eq!(
        child_namespace(&Principal::Open, "p", Some(Some("x"))),
        Ok(Some("x".into()))
    );
}

const UID: &str = "0b5e8a2c-0000-4000-8000-000000000001";

#[test]
fn a_bearer_token_names_a_client_or_a_namespaces_reporter() {
    let key = ReportKey::new(b"0123456789abcdef0123456789abcdef").unwrap();
    let team = key.token("team", UID).unwrap();
    let clients = ClientTokens::parse("client-token-0123456789 namespaces=team\n").unwrap();
    let with_key = Credentials {
        clients: clients.clone(),
        report_key: Some(key),
        namespaces: NamespaceUids::Off,
    };
    assert_eq!(with_key.principal(&team), Ok(reporter("team")));
    assert_eq!(
        with_key.principal("client-token-0123456789"),
        Ok(client(Scope::All, only(&["team"])))
    );
    assert_eq!(
        with_key.principal(&format!("asya-report.team.{UID}.00")),
        Err(Unauthenticated::NotAccepted)
    );
    assert_eq!(
        with_key.principal("someone-elses-token-00"),
        Err(Unauthenticated::NotAccepted)
    );
    // The first format, even made by this key, is refused saying so.
    let v1 = "asya-report.team.a47a24a2342dd4329b1647e65982c7465759344300009e979ae61997e9fc0085";
    let e = with_key.principal(v1).unwrap_err();
    assert!(matches!(e, Unauthenticated::FirstFormat(_)), "{e:?}");
    assert!(e.to_string().contains("no longer accepted"), "{e}");
    let without = Credentials {
        clients,
        report_key: None,
        namespaces: NamespaceUids::Off,
    };
    assert_eq!(without.principal(&team), Err(Unauthenticated::NoReportKey));
}

#[test]
fn a_report_token_of_a_namespace_made_again_is_refused() {
    use kube::core::metadata::PartialObjectMetaExt;
    use kube::runtime::watcher::Event;
    let ns = |uid: &str| {
        k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some("team".into()),
            uid: Some(uid.into()),
            ..Default::default()
        }
        .into_response_partial::<k8s_openapi::api::core::v1::Namespace>()
    };
    let key = ReportKey::new(b"0123456789abcdef0123456789abcdef").unwrap();
    let old = key.token("team", UID).unwrap();
    let (watched, mut feed) = namespaces::Watched::new();
    let creds = Credentials {
        clients: ClientTokens::default(),
        report_key: Some(key),
        namespaces: NamespaceUids::Watched(watched),
    };
    let e = creds.principal(&old).unwrap_err();
    assert!(
        matches!(&e, Unauthenticated::Uid(u) if u.code() == "namespace_uids_not_listed"),
        "{e:?}"
    );
    feed.apply(&Event::Init);
    feed.apply(&Event::InitApply(ns(UID)));
    feed.apply(&Event::InitDone);
    assert_eq!(creds.principal(&old), Ok(reporter("team")));
    feed.apply(&Event::Delete(ns(UID)));
    let new_uid = "0b5e8a2c-0000-4000-8000-000000000002";
    feed.apply(&Event::Apply(ns(new_uid)));
    let e = creds.principal(&old).unwrap_err();
    assert!(
        matches!(&e, Unauthenticated::Uid(u) if u.code() == "report_token_stale"),
        "{e:?}"
    );
    assert!(
        !e.to_string().contains(&old),
        "the token is never told back"
    );
    let current = ReportKey::new(b"0123456789abcdef0123456789abcdef")
        .unwrap()
        .token("team", new_uid)
        .unwrap();
    assert_eq!(creds.principal(&current), Ok(reporter("team")));
}
