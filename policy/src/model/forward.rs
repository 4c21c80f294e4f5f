//! `[audit.forward]`: where metaliftd forwards its audit records (a syslog collector).
//!
//! It lives in the policy, not in a daemon configuration file of its own, because the
//! policy is already what an admin edits and what metaliftd watches: it is validated
//! with located diagnostics by `metalift validate`, described by the policy's JSON
//! Schema, hashed into every `policy_loaded` record, and reloaded without a restart.
//!
//! ```toml
//! [audit.forward]
//! address = "logs.example.net:6514"
//! transport = "tls"            # or "tcp" (the default), "relp", or "relp-tls"
//! ca = "/etc/metalift/collector-ca.pem"
//! client_cert = "/etc/metalift/client.pem"   # both or neither: mutual TLS
//! client_key = "/etc/metalift/client.key"
//! server_name = "logs.example.net"           # default: the address's host
//! max_delay_seconds = 30       # records undelivered longer: metaliftd is degraded
//! ```
//!
//! Pure: the paths are checked for form (absolute) only; the daemon reads them.

use std::ops::Range;

use toml::de::DeValue;
use toml::Spanned;

use crate::diagnostic::{Diagnostic, LineIndex, Severity, Source};
use crate::model::{At, FileModel, Sink};

/// The keys `[audit.forward]` accepts.
pub const FORWARD_KEYS: &[&str] = &[
    "address",
    "transport",
    "ca",
    "client_cert",
    "client_key",
    "server_name",
    "max_delay_seconds",
];

/// `max_delay_seconds` when not set: records undelivered for longer make the
/// daemon's health `forward_behind` (degraded).
pub const DEFAULT_MAX_DELAY_SECONDS: u64 = 30;
/// The largest `max_delay_seconds` accepted (an hour: a longer silence is not
/// something a health probe should wait for).
pub const MAX_MAX_DELAY_SECONDS: u64 = 3600;

/// How records travel to the collector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// Plain TCP, RFC 6587 octet-counting framing.
    Tcp,
    /// TLS (RFC 5425), the same framing inside.
    Tls,
    /// RELP (rsyslog's librelp, `imrelp`) over TCP: the collector answers every
    /// message, so what was delivered is known.
    Relp,
    /// RELP inside TLS (`imrelp` with `tls="on"`): RELP's answers and TLS's
    /// certificate checks, with the same keys as `tls`.
    RelpTls,
}

impl Transport {
    /// Whether the connection is TLS (`tls` and `relp-tls`: `ca` and the
    /// certificate keys apply).
    #[must_use]
    pub fn is_tls(self) -> bool {
        matches!(self, Transport::Tls | Transport::RelpTls)
    }

    /// Whether records go as RELP transactions (`relp` and `relp-tls`).
    #[must_use]
    pub fn is_relp(self) -> bool {
        matches!(self, Transport::Relp | Transport::RelpTls)
    }

    /// The word the policy and `metalift status` use.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Transport::Tcp => "tcp",
            Transport::Tls => "tls",
            Transport::Relp => "relp",
            Transport::RelpTls => "relp-tls",
        }
    }
}

/// A validated `[audit.forward]` table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forward {
    /// `host:port` of the collector (a name, an IPv4 address, or `[v6]:port`).
    pub address: String,
    /// The host part of `address` (brackets removed).
    pub host: String,
    /// The port.
    pub port: u16,
    /// TCP or TLS.
    pub transport: Transport,
    /// PEM file of the CA(s) the collector's certificate must chain to (TLS only).
    pub ca: Option<String>,
    /// PEM certificate chain and private key presented to the collector (mutual TLS).
    pub client_cert: Option<String>,
    /// The client certificate's private key (PEM).
    pub client_key: Option<String>,
    /// The name the collector's certificate must carry; default: [`Forward::host`].
    pub server_name: String,
    /// How long a record may wait undelivered before the daemon's health says
    /// `forward_behind` (1 to [`MAX_MAX_DELAY_SECONDS`]; default
    /// [`DEFAULT_MAX_DELAY_SECONDS`]).
    pub max_delay_seconds: u64,
}

/// `[audit.forward]` as written, every value located.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct RawForward {
    /// The `[audit.forward]` table, for problems that belong to no single key.
    pub span: Range<usize>,
    pub address: Option<At<String>>,
    pub transport: Option<At<String>>,
    pub ca: Option<At<String>>,
    pub client_cert: Option<At<String>>,
    pub client_key: Option<At<String>>,
    pub server_name: Option<At<String>>,
    pub max_delay_seconds: Option<At<i64>>,
}

/// Reads the `forward` table of `[audit]` (stage 1: types and unknown keys only).
pub(crate) fn parse(sink: &mut Sink<'_>, value: &Spanned<DeValue<'_>>) -> Option<RawForward> {
    let table = sink.table(value, "audit.forward")?;
    let mut raw = RawForward {
        span: value.span(),
        ..RawForward::default()
    };
    for (key, v) in table.iter() {
        let k = key.get_ref().as_ref();
        if k == "max_delay_seconds" {
            raw.max_delay_seconds = sink.int(v, k);
            continue;
        }
        let slot = match k {
            "address" => &mut raw.address,
            "transport" => &mut raw.transport,
            "ca" => &mut raw.ca,
            "client_cert" => &mut raw.client_cert,
            "client_key" => &mut raw.client_key,
            "server_name" => &mut raw.server_name,
            other => {
                sink.unknown_key(key.span(), other, "[audit.forward]", FORWARD_KEYS);
                continue;
            }
        };
        *slot = sink.string(v, k);
    }
    Some(raw)
}

/// Validates the `[audit.forward]` tables of all files: at most one (in any file),
/// every value judged, each problem located. `None` when there is none or it is invalid.
pub(crate) fn compile(
    sources: &[Source],
    files: &[FileModel],
    out: &mut Vec<Diagnostic>,
) -> Option<Forward> {
    let mut found: Option<Forward> = None;
    let mut seen = false;
    for (source, file) in sources.iter().zip(files) {
        let Some(raw) = &file.forward else { continue };
        let lines = LineIndex::new(&source.text);
        let mut err = |span: Range<usize>, message: String| {
            out.push(Diagnostic::located(
                Severity::Error,
                source,
                &lines,
                span,
                message,
            ));
        };
        if seen {
            err(
                raw.span.clone(),
                "`[audit.forward]` is already set in an earlier policy file: set it once".into(),
            );
            continue;
        }
        seen = true;
        found = judge(raw, &mut err);
    }
    found
}

fn judge(raw: &RawForward, err: &mut dyn FnMut(Range<usize>, String)) -> Option<Forward> {
    let mut ok = true;
    let Some(address) = &raw.address else {
        err(
            raw.span.clone(),
            "`[audit.forward]` needs `address = \"host:port\"`".into(),
        );
        return None;
    };
    let parsed = split_address(&address.value);
    if let Err(why) = &parsed {
        err(address.span.clone(), format!("`address` {why}"));
        ok = false;
    }
    let transport = match raw.transport.as_ref().map(|t| t.value.as_str()) {
        None | Some("tcp") => Transport::Tcp,
        Some("tls") => Transport::Tls,
        Some("relp") => Transport::Relp,
        Some("relp-tls") => Transport::RelpTls,
        Some(other) => {
            let span = raw
                .transport
                .as_ref()
                .map_or(raw.span.clone(), |t| t.span.clone());
            err(
                span,
                format!(
                    "`transport` must be \"tcp\", \"tls\", \"relp\" or \"relp-tls\", found \"{other}\""
                ),
            );
            return None;
        }
    };
    for p in [&raw.ca, &raw.client_cert, &raw.client_key]
        .into_iter()
        .flatten()
    {
        if !p.value.starts_with('/') {
            err(
                p.span.clone(),
                format!("`{}` must be an absolute path", p.value),
            );
            ok = false;
        }
    }
    if !transport.is_tls() {
        for (name, v) in [
            ("ca", &raw.ca),
            ("client_cert", &raw.client_cert),
            ("client_key", &raw.client_key),
            ("server_name", &raw.server_name),
        ] {
            if let Some(v) = v {
                err(
                    v.span.clone(),
                    format!("`{name}` applies only with `transport = \"tls\"` or `\"relp-tls\"`"),
                );
                ok = false;
            }
        }
    } else if raw.ca.is_none() {
        err(
            raw.span.clone(),
            format!(
                "`transport = \"{}\"` needs `ca`: the PEM file of the CA the collector's certificate chains to",
                transport.as_str()
            ),
        );
        ok = false;
    }
    match (&raw.client_cert, &raw.client_key) {
        (Some(c), None) => {
            err(c.span.clone(), "`client_cert` needs `client_key`".into());
            ok = false;
        }
        (None, Some(k)) => {
            err(k.span.clone(), "`client_key` needs `client_cert`".into());
            ok = false;
        }
        _ => {}
    }
    let max_delay_seconds = match &raw.max_delay_seconds {
        None => DEFAULT_MAX_DELAY_SECONDS,
        Some(n) => match u64::try_from(n.value) {
            Ok(s) if (1..=MAX_MAX_DELAY_SECONDS).contains(&s) => s,
            _ => {
                err(
                    n.span.clone(),
                    format!(
                        "`max_delay_seconds` must be 1 to {MAX_MAX_DELAY_SECONDS}, found {}",
                        n.value
                    ),
                );
                ok = false;
                DEFAULT_MAX_DELAY_SECONDS
            }
        },
    };
    let (host, port) = parsed.ok()?;
    if !ok {
        return None;
    }
    let value = |v: &Option<At<String>>| v.as_ref().map(|v| v.value.clone());
    Some(Forward {
        address: address.value.clone(),
        server_name: value(&raw.server_name).unwrap_or_else(|| host.clone()),
        host,
        port,
        transport,
        ca: value(&raw.ca),
        client_cert: value(&raw.client_cert),
        client_key: value(&raw.client_key),
        max_delay_seconds,
    })
}

/// `host:port` or `[v6]:port` into its parts.
fn split_address(address: &str) -> Result<(String, u16), String> {
    let (host, port) = if let Some(rest) = address.strip_prefix('[') {
        let (h, p) = rest
            .split_once("]:")
            .ok_or("must be \"[v6-address]:port\"")?;
        (h, p)
    } else {
        address
            .rsplit_once(':')
            .filter(|(h, _)| !h.contains(':'))
            .ok_or("must be \"host:port\" (an IPv6 address in brackets)")?
    };
    if host.is_empty() {
        return Err("has no host before the port".into());
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => Ok((host.to_owned(), p)),
        _ => Err(format!("has port \"{port}\": expected 1-65535")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_split_into_host_and_port_and_bad_ones_say_why() {
        assert_eq!(split_address("logs:6514"), Ok(("logs".into(), 6514)));
        assert_eq!(split_address("[::1]:514"), Ok(("::1".into(), 514)));
        assert!(split_address("logs").is_err());
        assert!(split_address("::1:514").is_err());
        assert!(split_address("logs:0").is_err());
        assert!(split_address(":514").is_err());
        assert!(split_address("logs:99999").is_err());
    }

    #[test]
    fn relp_is_a_transport_and_takes_no_tls_keys() {
        let compile = |text: &str| {
            crate::compile_sources(vec![crate::Source::new(
                "policy.toml",
                format!("version = 1\n\n[audit.forward]\naddress = \"logs:2514\"\n{text}"),
            )])
        };
        let loaded = compile("transport = \"relp\"\n").expect("relp is a transport");
        let forward = loaded.policy.forward().expect("forwarding configured");
        assert_eq!(forward.transport, Transport::Relp);
        let Err(crate::LoadError::Invalid { diagnostics, .. }) =
            compile("transport = \"relp\"\nca = \"/ca.pem\"\n")
        else {
            panic!("a CA with relp is refused");
        };
        assert!(
            diagnostics.iter().any(|d| d
                .message
                .contains("`ca` applies only with `transport = \"tls\"`")),
            "{diagnostics:?}"
        );
        let Err(crate::LoadError::Invalid { diagnostics, .. }) = compile("transport = \"rlep\"\n")
        else {
            panic!("an unknown transport is refused");
        };
        assert!(
            diagnostics.iter().any(|d| d
                .message
                .contains("\"tcp\", \"tls\", \"relp\" or \"relp-tls\", found \"rlep\"")),
            "{diagnostics:?}"
        );
        // RELP inside TLS takes the TLS keys, and needs the CA as tls does.
        let loaded = compile("transport = \"relp-tls\"\nca = \"/ca.pem\"\n").expect("relp-tls");
        let forward = loaded.policy.forward().expect("forwarding configured");
        assert_eq!(forward.transport, Transport::RelpTls);
        assert!(forward.transport.is_tls() && forward.transport.is_relp());
        let Err(crate::LoadError::Invalid { diagnostics, .. }) =
            compile("transport = \"relp-tls\"\n")
        else {
            panic!("relp-tls without a CA is refused");
        };
        assert!(
            diagnostics
                .iter()
                .any(|d| d.message.contains("`transport = \"relp-tls\"` needs `ca`")),
            "{diagnostics:?}"
        );
    }
}
