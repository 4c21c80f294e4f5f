//! The watcher driven through its event seam ([`EventSink`]) with a backend that
//! reports what FSEvents reports (no close events), so the macOS behaviour runs
//! on Linux: a half-written policy never goes live.

use std::io::Write;
use std::sync::Mutex;

use notify::event::{DataChange, MetadataKind, ModifyKind};
use notify::{Event, EventKind};

use super::*;
use metalift_policy::LoadOptions;

fn policy_with_rules(n: usize) -> String {
    let mut text = String::from("version = 1\n\n[profile.apple7]\napple_family_max = 7\n");
    for i in 0..n {
        text.push_str(&format!(
            "\n[[rule]]\nid = \"rule-{i}\"\npath = \"/opt/tool-{i}/bin/*\"\nunlock = \"apple7\"\n"
        ));
    }
    text
}

/// A running watcher over `<tmp>/etc/policy.toml` whose backend is the test: it
/// reports events by calling the returned sink, and says closes as `signal`.
struct Rig {
    _tmp: tempfile::TempDir,
    policy: PathBuf,
    audit_path: PathBuf,
    store: Arc<PolicyStore>,
    sink: EventSink,
    task: JoinHandle<()>,
}

impl Rig {
    fn start(initial: &str, signal: CloseSignal) -> Rig {
        let tmp = tempfile::tempdir().unwrap();
        let etc = tmp.path().join("etc");
        std::fs::create_dir(&etc).unwrap();
        let policy = etc.join("policy.toml");
        std::fs::write(&policy, initial).unwrap();
        let audit_path = tmp.path().join("audit.jsonl");
        let audit =
            Arc::new(AuditLog::open(&audit_path, crate::audit::Rotation::default()).unwrap());
        let store =
            Arc::new(PolicyStore::load_initial(&policy, LoadOptions::default(), &audit).unwrap());
        let (tx, rx) = mpsc::channel(64);
        let captured = Mutex::new(None);
        let mut watches = Watches::with_backend(&policy, tx, |sink| {
            *captured.lock().unwrap() = Some(sink);
            (Box::new(notify::NullWatcher), signal)
        });
        watches.reconcile();
        let sink = captured
            .into_inner()
            .unwrap()
            .expect("the backend got the sink");
        let timing = Timing {
            debounce: DEFAULT_DEBOUNCE,
            recheck: Duration::from_secs(3600),
            delete_grace: Duration::from_secs(2),
        };
        let task = tokio::spawn(run(
            Arc::clone(&store),
            audit,
            timing,
            watches,
            rx,
            ReloadOutcome::Unchanged,
        ));
        Rig {
            _tmp: tmp,
            policy,
            audit_path,
            store,
            sink,
            task,
        }
    }

    /// What the backend reports about the policy file.
    fn report(&self, kind: EventKind) {
        self.sink
            .take(Ok(Event::new(kind).add_path(self.policy.clone())));
    }

    async fn until_rules(&self, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.store.current().rule_count != n {
            assert!(Instant::now() < deadline, "gave up waiting for {n} rules");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The `rules` of every `policy_loaded` record, in order.
    fn loads(&self) -> Vec<u64> {
        std::fs::read_to_string(&self.audit_path)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .filter(|r| r["kind"] == "policy_loaded")
            .map(|r| r["rules"].as_u64().unwrap())
            .collect()
    }
}

#[tokio::test]
async fn given_fsevents_like_events_then_a_half_written_policy_never_goes_live() {
    let rig = Rig::start(&policy_with_rules(2), CloseSignal::ContentModified);
    let whole = policy_with_rules(3);
    // Cut right after the first rule: the first half alone is a valid 1-rule policy.
    let cut = whole.find("\n[[rule]]\nid = \"rule-1\"").unwrap();
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&rig.policy)
        .unwrap();
    // open(O_TRUNC): vnode_setattr's FSE_STAT_CHANGED, ItemInodeMetaMod.
    rig.report(EventKind::Modify(ModifyKind::Metadata(MetadataKind::Any)));
    file.write_all(&whole.as_bytes()[..cut]).unwrap();
    // Far longer than the debounce: the writer is slow, not done. A write
    // produces no FSEvent at all.
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(
        rig.store.current().rule_count,
        2,
        "the half-written file went live"
    );
    file.write_all(&whole.as_bytes()[cut..]).unwrap();
    drop(file);
    // close(): vn_close's FSE_CONTENT_MODIFIED, ItemModified.
    rig.report(EventKind::Modify(ModifyKind::Data(DataChange::Content)));
    rig.until_rules(3).await;
    assert_eq!(rig.loads(), [2, 3], "only the whole file went live");
    rig.task.abort();
}

#[tokio::test]
async fn given_fsevents_like_events_then_a_writer_that_never_closes_is_read_after_the_grace() {
    let rig = Rig::start(&policy_with_rules(2), CloseSignal::ContentModified);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&rig.policy)
        .unwrap();
    rig.report(EventKind::Modify(ModifyKind::Metadata(MetadataKind::Any)));
    file.write_all(policy_with_rules(4).as_bytes()).unwrap();
    // Still open, no close event: after OPEN_WRITE_GRACE without events it is read.
    rig.until_rules(4).await;
    drop(file);
    rig.task.abort();
}
