//! Plain-text tables for `rpcrdmactl`'s human output.

/// Formats `rows` under `headers`, columns left-aligned and padded to their widest cell.
pub fn render(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut l = String::new();
        for (i, c) in cells.enumerate() {
            let w = widths.get(i).copied().unwrap_or(0);
            if i > 0 {
                l.push_str("  ");
            }
            l.push_str(c);
            l.extend(std::iter::repeat_n(
                ' ',
                w.saturating_sub(c.chars().count()),
            ));
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    line(&mut headers.iter().copied());
    for r in rows {
        line(&mut r.iter().map(String::as_str));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::render;

    #[test]
    fn columns_are_padded_to_the_widest_cell() {
        let t = render(
            &["ID", "PEER"],
            &[
                vec!["1".into(), "server".into()],
                vec!["12".into(), "x".into()],
            ],
        );
        assert_eq!(t, "ID  PEER\n1   server\n12  x\n");
    }
}
