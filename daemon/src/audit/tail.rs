//! Finding where the last `n` wanted lines of a log file start, by reading it
//! backwards from its end in bounded chunks (for `metalift audit --follow -n N`),
//! so following a large log never replays its history.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::Path;

use super::line::{parse_line, Item};

/// Bytes read per step backwards.
const CHUNK: u64 = 64 * 1024;

/// The byte offset in `file` where the last `n` complete lines that `wanted`
/// accepts begin, and how many it found: the end of the last complete line when
/// `n` is 0; the start of the file when it has fewer. An unfinished last line (no
/// newline yet) is left for the forward reader. Memory: one chunk plus the
/// longest line.
pub fn start_of_last(
    file: &mut File,
    name: &Path,
    n: usize,
    wanted: &mut dyn FnMut(&Item) -> bool,
) -> io::Result<(u64, usize)> {
    let len = file.metadata()?.len();
    // `buf` holds the file's bytes [pos, pos + buf.len()): lines not judged yet.
    let mut buf: Vec<u8> = Vec::new();
    let mut pos = len;
    let mut found = 0usize;
    let mut trimmed_tail = false;
    loop {
        if pos > 0 {
            let start = pos.saturating_sub(CHUNK);
            let mut chunk = vec![0u8; (pos - start) as usize];
            file.seek(SeekFrom::Start(start))?;
            file.read_exact(&mut chunk)?;
            chunk.extend_from_slice(&buf);
            buf = chunk;
            pos = start;
        }
        if !trimmed_tail {
            // Drop an unfinished last line: it is not a record yet.
            match buf.iter().rposition(|&b| b == b'\n') {
                Some(i) => {
                    buf.truncate(i + 1);
                    trimmed_tail = true;
                }
                None if pos == 0 => return Ok((0, 0)),
                None => continue,
            }
            if n == 0 {
                return Ok((pos + buf.len() as u64, 0));
            }
        }
        // Judge every line whose start is known: after a newline, or at offset 0.
        while let Some(body_end) = buf.len().checked_sub(1) {
            let line_start = match buf[..body_end].iter().rposition(|&b| b == b'\n') {
                Some(i) => i + 1,
                None if pos == 0 => 0,
                None => break,
            };
            let line = &buf[line_start..body_end];
            if !line.is_empty() {
                let item = match std::str::from_utf8(line) {
                    Ok(text) => parse_line(text, name, 0),
                    Err(e) => Item::Corrupt {
                        file: name.to_owned(),
                        line: 0,
                        error: format!("not UTF-8: {e}"),
                    },
                };
                if wanted(&item) {
                    found += 1;
                    if found == n {
                        return Ok((pos + line_start as u64, found));
                    }
                }
            }
            buf.truncate(line_start);
        }
        if pos == 0 {
            return Ok((0, found));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn record(id: u64) -> String {
        format!(
            "{{\"kind\":\"daemon_stop\",\"time\":\"2026-01-01T00:00:00Z\",\"reason\":\"r{id}\",\"checkins\":{id},\"unlocks\":0}}\n"
        )
    }

    fn start(text: &str, n: usize) -> u64 {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(text.as_bytes()).unwrap();
        start_of_last(&mut f, Path::new("t"), n, &mut |_| true)
            .unwrap()
            .0
    }

    #[test]
    fn the_last_n_lines_start_where_the_nth_from_the_end_begins() {
        let lines: Vec<String> = (0..5000).map(record).collect();
        let text = lines.concat();
        let offset_of = |i: usize| lines[..i].iter().map(String::len).sum::<usize>() as u64;
        assert_eq!(start(&text, 3), offset_of(4997));
        assert_eq!(start(&text, 0), text.len() as u64);
        // More lines than chunks hold: crosses chunk boundaries.
        assert_eq!(start(&text, 2000), offset_of(3000));
        assert_eq!(start(&text, 6000), 0);
    }

    #[test]
    fn an_unfinished_last_line_is_left_for_the_forward_reader() {
        let text = format!("{}{}{{\"kind\":\"dec", record(1), record(2));
        assert_eq!(start(&text, 0), (record(1).len() + record(2).len()) as u64);
        assert_eq!(start(&text, 1), record(1).len() as u64);
    }
}
