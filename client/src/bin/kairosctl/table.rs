//! Every table `kairosctl` prints: columns sized to their widest cell, so a
//! long id widens its column instead of shifting the others.

use comfy_table::{presets, CellAlignment, Table};

/// Prints `rows` under `header`; columns named in `right` are right-aligned.
pub fn print(header: &[&str], right: &[&str], rows: Vec<Vec<String>>) {
    println!("{}", render(header, right, rows));
}

fn render(header: &[&str], right: &[&str], rows: Vec<Vec<String>>) -> String {
    let mut t = Table::new();
    t.load_style(presets::NOTHING).set_header(header.to_vec());
    for row in rows {
        t.add_row(row);
    }
    for (i, name) in header.iter().enumerate() {
        if right.contains(name) {
            if let Some(c) = t.column_mut(i) {
                c.set_cell_alignment(CellAlignment::Right);
            }
        }
    }
    // Padding of one space each side, none at the line's ends.
    t.lines()
        .map(|l| l.get(1..).unwrap_or("").trim_end().to_string())
        .collect::<Vec<_>>()
        .join("\n")
}

/// Two-column key/value table (a record shown field by field).
pub fn print_fields(rows: Vec<(&str, String)>) {
    let rows = rows
        .into_iter()
        .map(|(k, v)| vec![k.to_string(), v])
        .collect();
    let text = render(&["FIELD", "VALUE"], &[], rows);
    // The header adds nothing to a record.
    println!("{}", text.lines().skip(1).collect::<Vec<_>>().join("\n"));
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_long_id_widens_its_column_and_keeps_the_others_aligned() {
        let long = "x".repeat(100);
        let text = super::render(
            &["ID", "REV", "GROUP"],
            &["REV"],
            vec![
                vec![long.clone(), "1".into(), "g".into()],
                vec!["a".into(), "12".into(), "g2".into()],
            ],
        );
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        let group_at: Vec<usize> = lines.iter().map(|l| l.rfind(['g', 'G']).unwrap()).collect();
        assert!(group_at.iter().all(|c| *c == group_at[0]), "{text}");
        assert!(lines[1].starts_with(&long), "{text}");
        assert!(lines[2].contains(" 12 "), "{text}");
    }
}
