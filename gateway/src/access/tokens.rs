//! The client tokens file (a mounted Secret): one token per line, blank lines and `#`
//! comments skipped, as it always was; a line may go on with limits, each a `key=v1,v2`
//! word:
//!
//! ```text
//! 3f9c…e1                                   # every tool, every namespace (as before)
//! 7a2d…90 tools=summarise,translate         # only these tools
//! c4b8…11 namespaces=team-a                 # only tools of, and envelopes in, team-a
//! ```
//!
//! Errors name the line, the word and the rule, never the token.

use std::collections::{BTreeSet, HashMap};

use asya_api::validate::is_dns_label;

use super::report_key;
use super::{ClientGrant, Scope};

/// Characters a token has at least.
pub const MIN_TOKEN_CHARS: usize = 16;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("line {line}: {what}: {rule}")]
pub struct TokenLineError {
    pub line: usize,
    /// The word at fault (a limit), or `token` (the token itself is never shown).
    pub what: String,
    pub rule: String,
}

/// The client tokens, by token.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClientTokens {
    grants: HashMap<String, ClientGrant>,
}

impl ClientTokens {
    pub fn get(&self, token: &str) -> Option<&ClientGrant> {
        self.grants.get(token)
    }

    pub fn len(&self) -> usize {
        self.grants.len()
    }

    pub fn is_empty(&self) -> bool {
        self.grants.is_empty()
    }

    /// Parses the file; every bad line is reported at once.
    pub fn parse(text: &str) -> Result<ClientTokens, Vec<TokenLineError>> {
        let mut errors = Vec::new();
        let mut grants = HashMap::new();
        for (i, raw) in text.lines().enumerate() {
            let line = i + 1;
            let content = raw.split_once(" #").map_or(raw, |(c, _)| c).trim();
            if content.is_empty() || content.starts_with('#') {
                continue;
            }
            let mut words = content.split_whitespace();
            let Some(token) = words.next() else { continue };
            let mut err = |what: &str, rule: String| {
                errors.push(TokenLineError {
                    line,
                    what: what.to_string(),
                    rule,
                })
            };
            if token.chars().count() < MIN_TOKEN_CHARS {
                err(
                    "token",
                    format!(
                        "a token of {} characters is too short (at least {MIN_TOKEN_CHARS})",
                        token.chars().count()
                    ),
                );
                continue;
            }
            if token.starts_with(report_key::PREFIX) {
                err(
                    "token",
                    format!(
                        "starts with {:?}, the form of report tokens, which come from the \
                         report key (asya-gateway report-token) and are never listed here",
                        report_key::PREFIX
                    ),
                );
                continue;
            }
            let mut grant = ClientGrant::default();
            let mut seen = BTreeSet::new();
            for word in words {
                let Some((key, values)) = word.split_once('=') else {
                    err(
                        word,
                        "expected key=value,… (keys: tools, namespaces)".to_string(),
                    );
                    continue;
                };
                if !seen.insert(key.to_string()) {
                    err(word, format!("{key} is given twice on this line"));
                    continue;
                }
                let list: BTreeSet<String> = values
                    .split(',')
                    .filter(|v| !v.is_empty())
                    .map(str::to_string)
                    .collect();
                if list.is_empty() {
                    err(
                        word,
                        format!("{key} lists nothing; leave it out to allow all"),
                    );
                    continue;
                }
                match key {
                    "tools" => grant.tools = Scope::Only(list),
                    "namespaces" => {
                        if let Some(bad) = list.iter().find(|n| !is_dns_label(n)) {
                            err(
                                word,
                                format!("{bad:?} is not a namespace name (a DNS label)"),
                            );
                            continue;
                        }
                        grant.namespaces = Scope::Only(list);
                    }
                    other => err(
                        word,
                        format!("unknown key {other:?} (keys: tools, namespaces)"),
                    ),
                }
            }
            if grants.contains_key(token) {
                err(
                    "token",
                    "the same token is on an earlier line; give each token one line".to_string(),
                );
                continue;
            }
            grants.insert(token.to_string(), grant);
        }
        if errors.is_empty() {
            Ok(ClientTokens { grants })
        } else {
            Err(errors)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "token-a-0123456789";
    const B: &str = "token-b-0123456789";
    const C: &str = "token-c-0123456789";

    fn only(v: &[&str]) -> Scope {
        Scope::Only(v.iter().map(|s| s.to_string()).collect())
    }

    #[test]
    fn plain_lines_keep_their_meaning_and_limits_are_read() {
        let text = format!(
            "# tokens\n\n{A}\n  {B} tools=x,y   # two tools\n{C} namespaces=team-a tools=z\n"
        );
        let t = ClientTokens::parse(&text).unwrap();
        assert_eq!(t.len(), 3);
        assert_eq!(t.get(A), Some(&ClientGrant::default()));
        let b = t.get(B).unwrap();
        assert_eq!((&b.tools, &b.namespaces), (&only(&["x", "y"]), &Scope::All));
        let c = t.get(C).unwrap();
        assert_eq!(
            (&c.tools, &c.namespaces),
            (&only(&["z"]), &only(&["team-a"]))
        );
        assert_eq!(t.get("token-d-0123456789"), None);
    }

    #[test]
    fn every_bad_line_is_named_without_its_token() {
        let text = format!(
            "short\n{A} tool=x\n{B} tools=\n{C} namespaces=Team_A\n{A}\n\
             asya-report.team.00112233445566778899\ntoken-e-0123456789 tools=a tools=b\n\
             token-f-0123456789 x\n"
        );
        let errors = ClientTokens::parse(&text).unwrap_err();
        let text: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
        assert_eq!(
            text,
            [
                "line 1: token: a token of 5 characters is too short (at least 16)",
                "line 2: tool=x: unknown key \"tool\" (keys: tools, namespaces)",
                "line 3: tools=: tools lists nothing; leave it out to allow all",
                "line 4: namespaces=Team_A: \"Team_A\" is not a namespace name (a DNS label)",
                "line 5: token: the same token is on an earlier line; give each token one line",
                "line 6: token: starts with \"asya-report.\", the form of report tokens, which \
                 come from the report key (asya-gateway report-token) and are never listed here",
                "line 7: tools=b: tools is given twice on this line",
                "line 8: x: expected key=value,… (keys: tools, namespaces)",
            ]
        );
        for t in &text {
            assert!(!t.contains("0123456789"), "a token leaked: {t}");
        }
    }
}
