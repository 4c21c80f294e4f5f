//! `metaliftd`: the policy service. Thin: the server lives in `metalift_daemon`.

fn main() -> std::process::ExitCode {
    eprintln!("metaliftd: not built yet");
    std::process::ExitCode::from(2)
}
