//! Counting records in the log's bytes: one per newline. The forwarder's source
//! counts what is behind, and the gap count counts what a rotation deletes
//! (`gaps.rs`): both here, so neither module needs the other.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};

/// Newlines in `bytes`: whole records, as the log holds one per line.
pub(crate) fn newlines(bytes: &[u8]) -> u64 {
    memchr::memchr_iter(b'\n', bytes).count() as u64
}

/// Newlines in `file` from `from` up to `to` (or its end), and where that was.
pub(crate) fn count_range(file: &mut File, from: u64, to: Option<u64>) -> io::Result<(u64, u64)> {
    file.seek(SeekFrom::Start(from))?;
    let mut buf = vec![0u8; 64 * 1024];
    let (mut n, mut at) = (0u64, from);
    loop {
        let want = match to {
            Some(to) => usize::try_from(to.saturating_sub(at))
                .unwrap_or(usize::MAX)
                .min(buf.len()),
            None => buf.len(),
        };
        if want == 0 {
            return Ok((n, at));
        }
        let got = file.read(&mut buf[..want])?;
        if got == 0 {
            return Ok((n, at));
        }
        n += newlines(&buf[..got]);
        at += got as u64;
    }
}
