//! An error and its causes as one line, each said once.
//!
//! Many of our error types put their cause in their own message
//! (`cannot open audit log /x: Permission denied (os error 13)`) and also return it
//! as their `source()`, so anyhow's `{:#}` printed the OS error twice
//! (`…: Permission denied (os error 13): Permission denied (os error 13)`). Rather
//! than strip the cause from every message (the daemon's `tracing` lines print the
//! error alone, and need it), the chain is joined here skipping a cause the text
//! already says.

/// `err` and its causes, joined with `": "`, without a cause already in the text.
#[must_use]
pub fn describe(err: &anyhow::Error) -> String {
    join(err.chain().map(ToString::to_string))
}

/// Joins messages outermost first, skipping any already contained in what is joined.
#[must_use]
pub fn join(messages: impl IntoIterator<Item = String>) -> String {
    let mut text = String::new();
    for message in messages {
        if message.is_empty() || text.contains(&message) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&message);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cause_the_message_already_names_is_said_once() {
        let io = std::io::Error::from_raw_os_error(libc::ENOTDIR);
        let err = anyhow::Error::new(crate::audit::AuditError::CreateDir {
            path: "/etc/passwd/x".into(),
            source: io,
        })
        .context("cannot open the audit log");
        let text = describe(&err);
        assert_eq!(text.matches("os error 20").count(), 1, "{text}");
        assert!(
            text.starts_with(
                "cannot open the audit log: cannot create audit log directory /etc/passwd/x: "
            ),
            "{text}"
        );
    }

    #[test]
    fn causes_not_in_the_message_are_kept_in_order() {
        let err = anyhow::anyhow!("inner").context("middle").context("outer");
        assert_eq!(describe(&err), "outer: middle: inner");
    }
}
