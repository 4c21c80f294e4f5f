//! The committed impostor (`tests/fixtures/self-signed-team/`, see its README) is
//! what it says: a Mach-O whose CodeDirectory claims team `ABCDE12345` and
//! identifier `com.example.runner`, signed by a certificate whose designated
//! requirement pins a self-made root, not Apple's. On Linux the signature is read
//! here by hand (the layout of `<Security/CSCommon.h>` / `cs_blobs.h`: big-endian
//! SuperBlob, CodeDirectory slot 0, requirements slot 2); what the Security
//! framework then says about it (valid, not anchored at Apple: `untrusted`) is
//! the macOS workflow's check. Given that classification, the fixture's own
//! policy does not match it, while the same ids from a Developer ID would.

use std::path::PathBuf;

use metalift_daemon::checkin::peer::signature::trusted_ids;
use metalift_policy::{compile_sources, Action, Anchor, Source, Subject};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/self-signed-team")
        .join(name)
}

fn le32(b: &[u8], at: usize) -> usize {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap()) as usize
}

fn be32(b: &[u8], at: usize) -> usize {
    u32::from_be_bytes(b[at..at + 4].try_into().unwrap()) as usize
}

fn c_string(b: &[u8], at: usize) -> String {
    let end = b[at..].iter().position(|&c| c == 0).expect("NUL") + at;
    String::from_utf8(b[at..end].to_vec()).expect("UTF-8")
}

/// The embedded signature's blobs, by slot: (slot, bytes).
fn signature_blobs(macho: &[u8]) -> Vec<(usize, Vec<u8>)> {
    assert_eq!(le32(macho, 0), 0xfeed_facf, "a 64-bit Mach-O");
    assert_eq!(le32(macho, 4), 0x0100_000c, "arm64");
    assert_eq!(le32(macho, 12), 2, "MH_EXECUTE");
    let ncmds = le32(macho, 16);
    let mut at = 32;
    for _ in 0..ncmds {
        let (cmd, size) = (le32(macho, at), le32(macho, at + 4));
        if cmd == 0x1d {
            // LC_CODE_SIGNATURE: linkedit_data_command { cmd, cmdsize, dataoff, datasize }
            let off = le32(macho, at + 8);
            let sig = &macho[off..off + le32(macho, at + 12)];
            assert_eq!(be32(sig, 0), 0xfade_0cc0, "an embedded signature SuperBlob");
            return (0..be32(sig, 8))
                .map(|i| {
                    let (slot, blob) = (be32(sig, 12 + 8 * i), be32(sig, 16 + 8 * i));
                    let len = be32(sig, blob + 4);
                    (slot, sig[blob..blob + len].to_vec())
                })
                .collect();
        }
        at += size;
    }
    panic!("no LC_CODE_SIGNATURE")
}

#[test]
fn the_impostor_claims_the_fleets_team_with_a_self_signed_certificate() {
    let macho = std::fs::read(fixture("impostor")).expect("the fixture");
    let blobs = signature_blobs(&macho);
    let slot = |n: usize| &blobs.iter().find(|(s, _)| *s == n).expect("slot").1;

    let cd = slot(0);
    assert_eq!(be32(cd, 0), 0xfade_0c02, "CodeDirectory");
    assert!(be32(cd, 8) >= 0x20200, "a version with a team id field");
    assert_eq!(be32(cd, 12) & 0x2, 0, "not ad hoc (kSecCodeSignatureAdhoc)");
    assert_eq!(c_string(cd, be32(cd, 20)), "com.example.runner");
    assert_eq!(c_string(cd, be32(cd, 48)), "ABCDE12345");

    let requirements = slot(2);
    assert_eq!(be32(requirements, 0), 0xfade_0c01, "RequirementSet");
    let cms = slot(0x10000);
    assert_eq!(
        be32(cms, 0),
        0xfade_0b01,
        "a CMS signature: signed by a certificate"
    );
    let text = String::from_utf8_lossy(cms);
    assert!(text.contains("Developer ID Application: Not Apple (ABCDE12345)"));
    assert!(
        !text.contains("Apple Root CA") && !text.contains("Developer ID Certification Authority"),
        "no Apple certificate anywhere in the chain"
    );
}

#[test]
fn given_the_impostors_ids_as_untrusted_then_its_policy_does_not_match_it() {
    let text = std::fs::read_to_string(fixture("policy.toml")).expect("policy");
    let policy = compile_sources(vec![Source::new("policy.toml", text)])
        .expect("the fixture's policy is valid")
        .policy;
    let subject = |anchor: Anchor| {
        let (team_id, signing_id) =
            trusted_ids(anchor, Some("ABCDE12345"), Some("com.example.runner"));
        Subject {
            path: fixture("impostor"),
            team_id,
            signing_id,
            anchor: Some(anchor),
            ..Subject::default()
        }
    };
    let impostor = policy.evaluate(&subject(Anchor::Untrusted), std::time::SystemTime::now());
    assert_eq!((impostor.action, impostor.rule), (Action::Stock, None));
    let genuine = policy.evaluate(&subject(Anchor::DeveloperId), std::time::SystemTime::now());
    assert_eq!(genuine.rule.as_deref(), Some("signed-by-us"));
}
