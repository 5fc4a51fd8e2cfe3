//! Output: a plain table for people, JSON or YAML for scripts (`-o`). Pure: every function
//! returns the text; main prints it.

use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Default)]
pub enum Format {
    #[default]
    Table,
    Json,
    Yaml,
}

/// A table: a header row and rows of cells, printed left-aligned in columns two spaces
/// apart, as kubectl prints. An empty cell prints as `-`, so columns never collapse.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Table {
    pub headers: Vec<&'static str>,
    pub rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(headers: &[&'static str]) -> Table {
        Table {
            headers: headers.to_vec(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn render(&self) -> String {
        let cell = |s: &str| -> String {
            // One line per row: a message with newlines would break the columns.
            let flat = s.replace(['\n', '\r', '\t'], " ");
            if flat.is_empty() { "-".into() } else { flat }
        };
        let rows: Vec<Vec<String>> = self
            .rows
            .iter()
            .map(|r| r.iter().map(|c| cell(c)).collect())
            .collect();
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for r in &rows {
            for (i, c) in r.iter().enumerate() {
                if let Some(w) = widths.get_mut(i) {
                    *w = (*w).max(c.chars().count());
                }
            }
        }
        let line = |cells: Vec<&str>| -> String {
            let last = cells.len().saturating_sub(1);
            let mut out = String::new();
            for (i, c) in cells.into_iter().enumerate() {
                out.push_str(c);
                if i < last {
                    let w = widths.get(i).copied().unwrap_or(0);
                    let pad = w.saturating_sub(c.chars().count());
                    out.push_str(&" ".repeat(pad + 2));
                }
            }
            out.push('\n');
            out
        };
        let mut out = line(self.headers.clone());
        for r in &rows {
            out.push_str(&line(r.iter().map(String::as_str).collect()));
        }
        out
    }
}

/// `value` as JSON (pretty) or YAML; `Format::Table` is the caller's own table.
pub fn structured<T: Serialize>(value: &T, format: Format) -> String {
    match format {
        Format::Yaml => serde_yaml::to_string(value)
            .unwrap_or_else(|e| format!("# cannot render as YAML: {e}\n")),
        _ => {
            let mut s = serde_json::to_string_pretty(value)
                .unwrap_or_else(|e| format!("{{\"error\": \"cannot render as JSON: {e}\"}}"));
            s.push('\n');
            s
        }
    }
}

/// A duration in kubectl's short style: `45s`, `12m`, `3h`, `2d`.
pub fn age(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0..=119 => format!("{s}s"),
        120..=7199 => format!("{}m", s / 60),
        7200..=172_799 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

/// An optional count as a cell: `-` when the source cannot tell.
pub fn count<T: ToString>(v: Option<T>) -> String {
    v.map(|n| n.to_string()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_align_and_empty_cells_show_a_dash() {
        let mut t = Table::new(&["ID", "ACTOR", "ERROR"]);
        t.row(vec![
            "e1".into(),
            "validate".into(),
            "ValueError: bad\nline".into(),
        ]);
        t.row(vec!["long-id".into(), "".into(), "x".into()]);
        assert_eq!(
            t.render(),
            "ID       ACTOR     ERROR\n\
             e1       validate  ValueError: bad line\n\
             long-id  -         x\n"
        );
    }

    #[test]
    fn a_table_without_rows_is_its_header() {
        assert_eq!(Table::new(&["A", "B"]).render(), "A  B\n");
    }

    #[test]
    fn structured_forms() {
        let v = serde_json::json!({"id": "e1", "n": 2});
        assert_eq!(
            structured(&v, Format::Json),
            "{\n  \"id\": \"e1\",\n  \"n\": 2\n}\n"
        );
        assert_eq!(structured(&v, Format::Yaml), "id: e1\nn: 2\n");
    }

    #[test]
    fn ages_read_like_kubectl() {
        assert_eq!(age(45_000), "45s");
        assert_eq!(age(12 * 60_000), "12m");
        assert_eq!(age(3 * 3_600_000), "3h");
        assert_eq!(age(50 * 3_600_000), "2d");
        assert_eq!(count::<u32>(None), "");
        assert_eq!(count(Some(3)), "3");
    }
}
