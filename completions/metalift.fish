# Print an optspec for argparse to handle cmd's options that are independent of any subcommand.
function __fish_metalift_global_optspecs
    string join \n h/help V/version
end

function __fish_metalift_needs_command
    # Figure out if the current invocation already has a command.
    set -l cmd (commandline -opc)
    set -e cmd[1]
    argparse -s (__fish_metalift_global_optspecs) -- $cmd 2>/dev/null
    or return
    if set -q argv[1]
        # Also print the command, so this can be used to figure out what it is.
        echo $argv[1]
        return 1
    end
    return 0
end

function __fish_metalift_using_subcommand
    set -l cmd (__fish_metalift_needs_command)
    test -z "$cmd"
    and return 1
    contains -- $cmd[1] $argv
end

complete -c metalift -n "__fish_metalift_needs_command" -s h -l help -d 'Print help'
complete -c metalift -n "__fish_metalift_needs_command" -s V -l version -d 'Print version'
complete -c metalift -n "__fish_metalift_needs_command" -f -a "validate" -d 'Check a policy file (and its policy.d/) and print every problem with its location'
complete -c metalift -n "__fish_metalift_needs_command" -f -a "explain" -d 'Show which rule decides for an executable or a running process, and why'
complete -c metalift -n "__fish_metalift_needs_command" -f -a "status" -d 'Show the running daemon\'s policy and counters'
complete -c metalift -n "__fish_metalift_needs_command" -f -a "audit" -d 'Answers from the audit log: one line per process (decision joined with outcome), filters, summary'
complete -c metalift -n "__fish_metalift_needs_command" -f -a "exec" -d 'Run a command with libmetalift injected (--require-unlock: fail unless it was unlocked)'
complete -c metalift -n "__fish_metalift_needs_command" -f -a "demo" -d 'Start a throw-away daemon and show the shim\'s effect on the probe, end to end'
complete -c metalift -n "__fish_metalift_needs_command" -f -a "edit" -d 'Edit the policy safely (visudo-style): lock, edit a copy, validate, install atomically'
complete -c metalift -n "__fish_metalift_needs_command" -f -a "doctor" -d 'Check the installation: daemon, policy, audit log, shim, SIP, injection, rules\' executables'
complete -c metalift -n "__fish_metalift_needs_command" -f -a "verify" -d 'Run a profile\'s kernels on this machine (under the shim) and record the result for require_verified'
complete -c metalift -n "__fish_metalift_needs_command" -f -a "gpu" -d 'What the GPU answers with no unlock (families, threadgroup memory, name and class), the host chip, and which profiles it already meets'
complete -c metalift -n "__fish_metalift_needs_command" -f -a "schema" -d 'Print the JSON Schema of a policy file (for taplo / Even Better TOML)'
complete -c metalift -n "__fish_metalift_needs_command" -f -a "completions" -d 'Print the shell completion script for bash, zsh or fish'
complete -c metalift -n "__fish_metalift_needs_command" -f -a "__generate-docs" -d 'Write the man pages and completion scripts under DIR (for the repository and the .pkg)'
complete -c metalift -n "__fish_metalift_needs_command" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c metalift -n "__fish_metalift_using_subcommand validate" -l main -d 'Check PATH as a `policy.d/` drop-in of this installed main policy: with the main file and its other drop-ins, replacing one of the same file name' -r -F
complete -c metalift -n "__fish_metalift_using_subcommand validate" -l host-chip-brand -d 'The host chip\'s brand: what `apple_family_max = "host"` resolves to, and the family no profile is applied above (default: this machine\'s `machdep.cpu.brand_string` on macOS; where the chip is unknown, `"host"` draws a note and a ceiling of 9 or more a warning)' -r
complete -c metalift -n "__fish_metalift_using_subcommand validate" -l daemon-timeout -d 'How long to wait for the daemon\'s answer, in seconds [default: 5]' -r
complete -c metalift -n "__fish_metalift_using_subcommand validate" -l socket -d 'Ask the daemon on this socket for its policy size limit and host chip (used instead of the compiled defaults) and print its state as `status` judges it [default: none is asked]' -r -F
complete -c metalift -n "__fish_metalift_using_subcommand validate" -l strict -d 'Treat warnings about the policy\'s contents (lints included) as errors: exit 1. Owner and mode problems stay warnings'
complete -c metalift -n "__fish_metalift_using_subcommand validate" -l json -d 'Print one JSON document instead of text'
complete -c metalift -n "__fish_metalift_using_subcommand validate" -l skip-host-checks -d 'Skip every check against this machine (rule paths that are symlinks or missing, uid vs user, and its chip: `"host"` and the ceiling no profile is applied above; a chip named with --host-chip-brand is still judged): for checking a policy somewhere other than where it will run'
complete -c metalift -n "__fish_metalift_using_subcommand validate" -l allow-insecure-owner -d 'Do not report files not owned by root or writable by group/other'
complete -c metalift -n "__fish_metalift_using_subcommand validate" -s h -l help -d 'Print help'
complete -c metalift -n "__fish_metalift_using_subcommand explain" -l policy -d 'The main policy file (`policy.d/` beside it is read too). Not read with --live, which explains with the daemon\'s own policy' -r -F
complete -c metalift -n "__fish_metalift_using_subcommand explain" -l path -d 'Explain for this executable' -r -F
complete -c metalift -n "__fish_metalift_using_subcommand explain" -l pid -d 'Explain for this running process (Linux: read from /proc)' -r
complete -c metalift -n "__fish_metalift_using_subcommand explain" -l decision -d 'Re-explain this past decision (its id from the audit log) with the policy that was live then' -r
complete -c metalift -n "__fish_metalift_using_subcommand explain" -l socket -d 'The daemon\'s socket [default: the system daemon\'s socket when it exists (/run/metalift/metalift.sock; /var/run/metalift/metalift.sock on macOS), else the user\'s ($XDG_RUNTIME_DIR/metalift.sock; on macOS metalift.sock in the user\'s own DARWIN_USER_TEMP_DIR)]' -r -F
complete -c metalift -n "__fish_metalift_using_subcommand explain" -l daemon-timeout -d 'How long to wait for the daemon\'s answer, in seconds [default: 5]' -r
complete -c metalift -n "__fish_metalift_using_subcommand explain" -l log -l audit-log -d 'The audit log (its rotated files are read too); the policy archive is the `policies/` directory beside it. For --live and --decision. Or an export bundle\'s directory (`metalift audit export`): its records and the policies its decisions name' -r -F
complete -c metalift -n "__fish_metalift_using_subcommand explain" -l host-chip-brand -d 'What if the host chip were this brand (for `apple_family_max = "host"`, and the family no profile is applied above) [default: this machine\'s `machdep.cpu.brand_string` on macOS]' -r
complete -c metalift -n "__fish_metalift_using_subcommand explain" -l uid -d 'The uid to decide for (default: the process\'s, or yours with --path)' -r
complete -c metalift -n "__fish_metalift_using_subcommand explain" -l parent -d 'What if the parent process\'s executable were this' -r -F
complete -c metalift -n "__fish_metalift_using_subcommand explain" -l team-id -d 'What if the executable\'s valid signature had this team id' -r
complete -c metalift -n "__fish_metalift_using_subcommand explain" -l signing-id -d 'What if the executable\'s valid signature had this signing id' -r
complete -c metalift -n "__fish_metalift_using_subcommand explain" -l cdhash -d 'What if the executable\'s valid signature had this cdhash (40 hex digits)' -r
complete -c metalift -n "__fish_metalift_using_subcommand explain" -l anchor -d 'What if the signature were anchored at this: apple (Apple\'s own code, for `platform = true` rules), developer-id, app-store, apple-development, ad-hoc, untrusted, invalid, unsigned, unreadable. The daemon keeps a signature\'s team id and signing id only for the first four, and so does explain [default: none; --team-id/--signing-id are then taken as trusted]' -r
complete -c metalift -n "__fish_metalift_using_subcommand explain" -l live -d 'Explain with the running daemon\'s live policy instead of the file on disk'
complete -c metalift -n "__fish_metalift_using_subcommand explain" -l json -d 'Print one JSON document instead of text'
complete -c metalift -n "__fish_metalift_using_subcommand explain" -l allow-insecure-owner -d 'Accept policy files not owned by root or writable by group/other (development only)'
complete -c metalift -n "__fish_metalift_using_subcommand explain" -s h -l help -d 'Print help'
complete -c metalift -n "__fish_metalift_using_subcommand status" -l socket -d 'The daemon\'s socket [default: the system daemon\'s socket when it exists (/run/metalift/metalift.sock; /var/run/metalift/metalift.sock on macOS), else the user\'s ($XDG_RUNTIME_DIR/metalift.sock; on macOS metalift.sock in the user\'s own DARWIN_USER_TEMP_DIR)]' -r -F
complete -c metalift -n "__fish_metalift_using_subcommand status" -l daemon-timeout -d 'How long to wait for the daemon\'s answer, in seconds [default: 5]' -r
complete -c metalift -n "__fish_metalift_using_subcommand status" -l wait -d 'Wait up to SECS for a daemon to answer on the socket before judging (for a script that has just started one: a socket not there yet, or one left by an earlier daemon, is asked again); the exit status is then the state\'s' -r
complete -c metalift -n "__fish_metalift_using_subcommand status" -l json -d 'Print one JSON object (also when the daemon is down) instead of text'
complete -c metalift -n "__fish_metalift_using_subcommand status" -s h -l help -d 'Print help'
complete -c metalift -n "__fish_metalift_using_subcommand audit; and not __fish_seen_subcommand_from flush export help" -l log -l audit-log -d 'What to read: the audit log (its rotated files, PATH.1, PATH.2, ... and compressed ones, first), a collector\'s file or directory, an export bundle; any number, read in the order given' -r -F
complete -c metalift -n "__fish_metalift_using_subcommand audit; and not __fish_seen_subcommand_from flush export help" -l since -d 'Only from WHEN on: an RFC 3339 time (2026-11-30T11:00:00Z, or with +01:00), a date (UTC), `today`, `yesterday` (local midnight), or a duration ago (10m, 2h, 1day)' -r
complete -c metalift -n "__fish_metalift_using_subcommand audit; and not __fish_seen_subcommand_from flush export help" -l until -d 'Only before WHEN (same forms as --since)' -r
complete -c metalift -n "__fish_metalift_using_subcommand audit; and not __fish_seen_subcommand_from flush export help" -l exe -d 'Only this executable: a path (a symlink matches what it resolves to), a glob with `/` against the whole path, or a glob without `/` against the file name' -r
complete -c metalift -n "__fish_metalift_using_subcommand audit; and not __fish_seen_subcommand_from flush export help" -l rule -d 'Only decisions by rule ID (and their outcomes)' -r
complete -c metalift -n "__fish_metalift_using_subcommand audit; and not __fish_seen_subcommand_from flush export help" -l action -d 'Only decisions with this action (and their outcomes)' -r -f -a "unlock\t'Decisions that unlocked'
stock\t'Decisions that stayed stock'
would-unlock\t'Monitor mode: stayed stock, would have unlocked'"
complete -c metalift -n "__fish_metalift_using_subcommand audit; and not __fish_seen_subcommand_from flush export help" -l result -d 'Only processes whose outcome was this' -r -f -a "applied\t'The shim installed the profile'
stock\t'The shim stayed stock (told to, or could not ask)'
failed\t'The shim tried and rolled back'
no-outcome\t'No outcome was reported (the process never created a Metal device, or died)'"
complete -c metalift -n "__fish_metalift_using_subcommand audit; and not __fish_seen_subcommand_from flush export help" -l pid -d 'Only this process id' -r
complete -c metalift -n "__fish_metalift_using_subcommand audit; and not __fish_seen_subcommand_from flush export help" -l decision -d 'Only this decision id' -r
complete -c metalift -n "__fish_metalift_using_subcommand audit; and not __fish_seen_subcommand_from flush export help" -l kind -d 'Only records of this kind (implies --records)' -r -f -a "decision\t''
outcome\t''
refused\t''
policy_loaded\t''
policy_rejected\t''
daemon_start\t''
daemon_stop\t''
records_lost\t''
forward_gap\t''
verification\t''"
complete -c metalift -n "__fish_metalift_using_subcommand audit; and not __fish_seen_subcommand_from flush export help" -l host -d 'Only records of guests with this host name, or this clone name (`host.instance`, the instance file the orchestrator writes)' -r
complete -c metalift -n "__fish_metalift_using_subcommand audit; and not __fish_seen_subcommand_from flush export help" -l boot-id -d 'Only records of the guest boot whose boot id starts with this (8 characters are shown in the GUEST column)' -r
complete -c metalift -n "__fish_metalift_using_subcommand audit; and not __fish_seen_subcommand_from flush export help" -l label -d 'Only records whose host carries this label (`[audit.labels]`); repeatable, all must match' -r
complete -c metalift -n "__fish_metalift_using_subcommand audit; and not __fish_seen_subcommand_from flush export help" -l show-label -d 'Also show the value of this host label in the per-process view (a column in text and Markdown; JSON has every label); repeatable' -r
complete -c metalift -n "__fish_metalift_using_subcommand audit; and not __fish_seen_subcommand_from flush export help" -l by -d 'With --summary: one row per group of these keys (comma-separated): host, boot, label:NAME, job, rule, exe, chip, os (macOS build), result; counts of processes, unlocked, applied, failed (top reasons), stock, no outcome' -r
complete -c metalift -n "__fish_metalift_using_subcommand audit; and not __fish_seen_subcommand_from flush export help" -s n -l lines -d 'Only the last N processes (records, with --records) of the live file, like `tail -n`; with --follow, these first, then what is appended' -r
complete -c metalift -n "__fish_metalift_using_subcommand audit; and not __fish_seen_subcommand_from flush export help" -l job -d 'Only processes of this job: any value of the job claims the shim read from the process\'s environment (METALIFT_JOB_ID, GITHUB_RUN_ID, CI_JOB_ID, BUILDKITE_JOB_ID, BUILD_TAG, ...). Advisory: a process can claim any job. With --records: the decisions carrying it' -r
complete -c metalift -n "__fish_metalift_using_subcommand audit; and not __fish_seen_subcommand_from flush export help" -l image-label -d 'With --matrix: the host label that names the image (`[audit.labels]`)' -r
complete -c metalift -n "__fish_metalift_using_subcommand audit; and not __fish_seen_subcommand_from flush export help" -l records -d 'Show the raw records instead of one line per process'
complete -c metalift -n "__fish_metalift_using_subcommand audit; and not __fish_seen_subcommand_from flush export help" -l summary -d 'Print counts by result, rule and executable instead of lines'
complete -c metalift -n "__fish_metalift_using_subcommand audit; and not __fish_seen_subcommand_from flush export help" -s f -l follow -d 'Follow the log from its end as records are appended, across rotations (Ctrl-C to stop)'
complete -c metalift -n "__fish_metalift_using_subcommand audit; and not __fish_seen_subcommand_from flush export help" -l json -d 'JSON Lines: one object per process (with --records: each record as written)'
complete -c metalift -n "__fish_metalift_using_subcommand audit; and not __fish_seen_subcommand_from flush export help" -l markdown -d 'A Markdown table of the unlocks (process, rule, result), e.g. for $GITHUB_STEP_SUMMARY: `metalift audit --job "$GITHUB_RUN_ID" --markdown`. With --summary: the groups as a Markdown table'
complete -c metalift -n "__fish_metalift_using_subcommand audit; and not __fish_seen_subcommand_from flush export help" -l matrix -d 'The validated matrix: one row per host chip × macOS build × image × executable, with processes applied / failed / stock, the last verification of that chip, build and image, and the workload speed-ups measured there (text; --markdown, --json, or --html for one self-contained page)'
complete -c metalift -n "__fish_metalift_using_subcommand audit; and not __fish_seen_subcommand_from flush export help" -l html -d 'With --matrix: one self-contained HTML page (no script, nothing fetched)'
complete -c metalift -n "__fish_metalift_using_subcommand audit; and not __fish_seen_subcommand_from flush export help" -l require-verified -d 'With --matrix: exit 1 when a row\'s chip, macOS build and image has no passing last verification'
complete -c metalift -n "__fish_metalift_using_subcommand audit; and not __fish_seen_subcommand_from flush export help" -l fail-on-failed -d 'With --matrix: exit 1 when a row has a failed process'
complete -c metalift -n "__fish_metalift_using_subcommand audit; and not __fish_seen_subcommand_from flush export help" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c metalift -n "__fish_metalift_using_subcommand audit; and not __fish_seen_subcommand_from flush export help" -f -a "flush" -d 'Wait until every record written so far was delivered to the syslog collector'
complete -c metalift -n "__fish_metalift_using_subcommand audit; and not __fish_seen_subcommand_from flush export help" -f -a "export" -d 'Write a self-contained bundle (this boot\'s records, the daemon\'s status, the live policy, SHA256SUMS) into a directory, e.g. a CI artifact'
complete -c metalift -n "__fish_metalift_using_subcommand audit; and not __fish_seen_subcommand_from flush export help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c metalift -n "__fish_metalift_using_subcommand audit; and __fish_seen_subcommand_from flush" -l socket -d 'The daemon\'s socket [default: the system daemon\'s socket when it exists (/run/metalift/metalift.sock; /var/run/metalift/metalift.sock on macOS), else the user\'s ($XDG_RUNTIME_DIR/metalift.sock; on macOS metalift.sock in the user\'s own DARWIN_USER_TEMP_DIR)]' -r -F
complete -c metalift -n "__fish_metalift_using_subcommand audit; and __fish_seen_subcommand_from flush" -l daemon-timeout -d 'How long to wait for the daemon\'s answer, in seconds [default: 5]' -r
complete -c metalift -n "__fish_metalift_using_subcommand audit; and __fish_seen_subcommand_from flush" -l timeout -d 'Give up after this many seconds' -r
complete -c metalift -n "__fish_metalift_using_subcommand audit; and __fish_seen_subcommand_from flush" -s h -l help -d 'Print help'
complete -c metalift -n "__fish_metalift_using_subcommand audit; and __fish_seen_subcommand_from export" -l to -d 'The directory the bundle goes into (created if missing)' -r -F
complete -c metalift -n "__fish_metalift_using_subcommand audit; and __fish_seen_subcommand_from export" -l since -d 'Every record from WHEN on instead of this boot\'s (same forms as `metalift audit --since`)' -r
complete -c metalift -n "__fish_metalift_using_subcommand audit; and __fish_seen_subcommand_from export" -l log -l audit-log -d 'The audit log; its rotated files are read first' -r -F
complete -c metalift -n "__fish_metalift_using_subcommand audit; and __fish_seen_subcommand_from export" -l socket -d 'The daemon\'s socket [default: the system daemon\'s socket when it exists (/run/metalift/metalift.sock; /var/run/metalift/metalift.sock on macOS), else the user\'s ($XDG_RUNTIME_DIR/metalift.sock; on macOS metalift.sock in the user\'s own DARWIN_USER_TEMP_DIR)]' -r -F
complete -c metalift -n "__fish_metalift_using_subcommand audit; and __fish_seen_subcommand_from export" -l daemon-timeout -d 'How long to wait for the daemon\'s answer, in seconds [default: 5]' -r
complete -c metalift -n "__fish_metalift_using_subcommand audit; and __fish_seen_subcommand_from export" -s h -l help -d 'Print help'
complete -c metalift -n "__fish_metalift_using_subcommand audit; and __fish_seen_subcommand_from help" -f -a "flush" -d 'Wait until every record written so far was delivered to the syslog collector'
complete -c metalift -n "__fish_metalift_using_subcommand audit; and __fish_seen_subcommand_from help" -f -a "export" -d 'Write a self-contained bundle (this boot\'s records, the daemon\'s status, the live policy, SHA256SUMS) into a directory, e.g. a CI artifact'
complete -c metalift -n "__fish_metalift_using_subcommand audit; and __fish_seen_subcommand_from help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c metalift -n "__fish_metalift_using_subcommand exec" -l shim -d 'The shim to inject. Default: $METALIFT_SHIM, then ../lib/ and the directory of this executable, then /usr/local/metalift/lib' -r -F
complete -c metalift -n "__fish_metalift_using_subcommand exec" -l daemon-timeout -d 'How long to wait for the daemon\'s answer, in seconds [default: 5]' -r
complete -c metalift -n "__fish_metalift_using_subcommand exec" -l expect-family -d 'With --require-unlock (implied): the unlocked process must also answer AppleN or above (`N`, what llama.cpp\'s fast paths need: 7 holds on every host chip), or exactly AppleN (`=N`)' -r
complete -c metalift -n "__fish_metalift_using_subcommand exec" -l log -l audit-log -d 'The audit log --require-unlock reads the command\'s decision from' -r -F
complete -c metalift -n "__fish_metalift_using_subcommand exec" -l socket -d 'The daemon\'s socket, passed to the shim as METALIFT_SOCKET [default: as `metalift status`]' -r -F
complete -c metalift -n "__fish_metalift_using_subcommand exec" -l require-unlock -d 'Run the command as a child and exit 4 unless the daemon\'s audit log shows that it, or a process it started (a wrapper script\'s child), got an `unlock` verdict and the shim\'s outcome `applied` (for CI). A command that fails keeps its own exit status'
complete -c metalift -n "__fish_metalift_using_subcommand exec" -s q -l quiet -d 'Say nothing on stderr unless it explains a non-zero exit status (for scripts)'
complete -c metalift -n "__fish_metalift_using_subcommand exec" -s h -l help -d 'Print help'
complete -c metalift -n "__fish_metalift_using_subcommand demo" -l timeout-ms -d 'The shim\'s verdict deadline for the probe runs (METALIFT_TIMEOUT_MS); default: the shim\'s own' -r
complete -c metalift -n "__fish_metalift_using_subcommand demo" -l keep -d 'Keep the temporary directory (policies, sockets, audit logs) and print its path'
complete -c metalift -n "__fish_metalift_using_subcommand demo" -l json -d 'Print one JSON object (the cases and whether they came out as expected)'
complete -c metalift -n "__fish_metalift_using_subcommand demo" -s h -l help -d 'Print help'
complete -c metalift -n "__fish_metalift_using_subcommand edit" -l policy -d 'The main policy file; its policy.d/ drop-ins are validated with it' -r -F
complete -c metalift -n "__fish_metalift_using_subcommand edit" -l dropin -d 'Edit the drop-in policy.d/NAME (NAME.toml) instead of the main file' -r
complete -c metalift -n "__fish_metalift_using_subcommand edit" -l socket -d 'The daemon\'s socket [default: the system daemon\'s socket when it exists (/run/metalift/metalift.sock; /var/run/metalift/metalift.sock on macOS), else the user\'s ($XDG_RUNTIME_DIR/metalift.sock; on macOS metalift.sock in the user\'s own DARWIN_USER_TEMP_DIR)]' -r -F
complete -c metalift -n "__fish_metalift_using_subcommand edit" -l daemon-timeout -d 'How long to wait for the daemon\'s answer, in seconds [default: 5]' -r
complete -c metalift -n "__fish_metalift_using_subcommand edit" -l wait -d 'How long to wait for the daemon to make the new policy live' -r
complete -c metalift -n "__fish_metalift_using_subcommand edit" -l allow-insecure-owner -d 'Accept and install files not owned by root (development only, as metaliftd\'s flag)'
complete -c metalift -n "__fish_metalift_using_subcommand edit" -l json -d 'Print the result as one JSON object'
complete -c metalift -n "__fish_metalift_using_subcommand edit" -s h -l help -d 'Print help'
complete -c metalift -n "__fish_metalift_using_subcommand doctor" -l daemon-timeout -d 'How long to wait for the daemon\'s answer, in seconds [default: 5]' -r
complete -c metalift -n "__fish_metalift_using_subcommand doctor" -l policy -d 'The main policy file [default: /etc/metalift/policy.toml under --root]' -r -F
complete -c metalift -n "__fish_metalift_using_subcommand doctor" -l log -l audit-log -d 'The audit log [default: /var/log/metalift/audit.jsonl under --root]' -r -F
complete -c metalift -n "__fish_metalift_using_subcommand doctor" -l shim -d 'The shim [default: $METALIFT_SHIM, as `metalift exec` finds it; else /usr/local/metalift/lib/libmetalift.dylib (.so) under --root]' -r -F
complete -c metalift -n "__fish_metalift_using_subcommand doctor" -l root -d 'Look at an installation under DIR instead of / (tests, mounted images)' -r -F
complete -c metalift -n "__fish_metalift_using_subcommand doctor" -l require-label -d 'Fail unless the policy\'s [audit.labels] has KEY (repeatable), for fleet images' -r
complete -c metalift -n "__fish_metalift_using_subcommand doctor" -l socket -d 'The daemon\'s socket [default: as `metalift status`; under --root, the system socket there]' -r -F
complete -c metalift -n "__fish_metalift_using_subcommand doctor" -l allow-insecure-owner -d 'Accept a policy not owned by root (development, as metaliftd\'s flag)'
complete -c metalift -n "__fish_metalift_using_subcommand doctor" -l json -d 'Print one JSON object'
complete -c metalift -n "__fish_metalift_using_subcommand doctor" -l strict -d 'Warnings fail too (exit 1 when some check warns and none fails)'
complete -c metalift -n "__fish_metalift_using_subcommand doctor" -l bake -d 'For image bakes (Packer, CI): one line per check, `ok|warn|FAIL <check>: <message>`; exit 0 only when no line says FAIL'
complete -c metalift -n "__fish_metalift_using_subcommand doctor" -l require-forward -d 'Fail unless [audit.forward] is live and the forwarder is connected to its collector'
complete -c metalift -n "__fish_metalift_using_subcommand doctor" -l forward-unreachable-ok -d 'With --require-forward: the collector cannot be reached from the build network; configured is enough, and records waiting for it (forward_behind) do not fail'
complete -c metalift -n "__fish_metalift_using_subcommand doctor" -s h -l help -d 'Print help'
complete -c metalift -n "__fish_metalift_using_subcommand verify" -l profile -d 'The profile to verify (`[profile.NAME]` in the policy)' -r
complete -c metalift -n "__fish_metalift_using_subcommand verify" -l policy -d 'The policy file the profile is read from; the verification file (`verifications.jsonl`) is written beside it' -r -F
complete -c metalift -n "__fish_metalift_using_subcommand verify" -l audit-log -l log -d 'The audit log the `verification` record is appended to' -r -F
complete -c metalift -n "__fish_metalift_using_subcommand verify" -l socket -d 'The daemon\'s socket [default: the system daemon\'s socket when it exists (/run/metalift/metalift.sock; /var/run/metalift/metalift.sock on macOS), else the user\'s ($XDG_RUNTIME_DIR/metalift.sock; on macOS metalift.sock in the user\'s own DARWIN_USER_TEMP_DIR)]' -r -F
complete -c metalift -n "__fish_metalift_using_subcommand verify" -l daemon-timeout -d 'How long to wait for the daemon\'s answer, in seconds [default: 5]' -r
complete -c metalift -n "__fish_metalift_using_subcommand verify" -l timeout-ms -d 'The shim\'s verdict deadline for the probe (METALIFT_TIMEOUT_MS)' -r
complete -c metalift -n "__fish_metalift_using_subcommand verify" -l kernel-timeout -d 'Each kernel\'s deadline: its probe child is killed then and the kernel is `hung` (the verification fails)' -r
complete -c metalift -n "__fish_metalift_using_subcommand verify" -l timeout -d 'The whole verification\'s bound: kernels not started by then are `not_run` (the verification fails). Nothing is written until it ends' -r
complete -c metalift -n "__fish_metalift_using_subcommand verify" -l workload-runs -d 'How many times the workload runs each way (stock, unlocked; alternately)' -r
complete -c metalift -n "__fish_metalift_using_subcommand verify" -l min-speedup -d 'Fail the verification (exit 1) when any test\'s speed-up (median unlocked over median stock) is below X, e.g. 2' -r
complete -c metalift -n "__fish_metalift_using_subcommand verify" -l json -d 'Print the record as one JSON object'
complete -c metalift -n "__fish_metalift_using_subcommand verify" -l workload -d 'Also run the command after `--` stock (the shim disabled) and unlocked, and record its speed-up: each test\'s tokens per second for llama-bench\'s `-o json`, wall time for anything else. It runs after the kernels, within `--timeout` (killed at it: the verification fails)'
complete -c metalift -n "__fish_metalift_using_subcommand verify" -s h -l help -d 'Print help'
complete -c metalift -n "__fish_metalift_using_subcommand gpu" -l socket -d 'The daemon\'s socket [default: the system daemon\'s socket when it exists (/run/metalift/metalift.sock; /var/run/metalift/metalift.sock on macOS), else the user\'s ($XDG_RUNTIME_DIR/metalift.sock; on macOS metalift.sock in the user\'s own DARWIN_USER_TEMP_DIR)]' -r -F
complete -c metalift -n "__fish_metalift_using_subcommand gpu" -l daemon-timeout -d 'How long to wait for the daemon\'s answer, in seconds [default: 5]' -r
complete -c metalift -n "__fish_metalift_using_subcommand gpu" -l policy -d 'The policy whose profiles are compared with the stock answers (none compared when the file does not exist)' -r -F
complete -c metalift -n "__fish_metalift_using_subcommand gpu" -l json -d 'Print one JSON object instead of text'
complete -c metalift -n "__fish_metalift_using_subcommand gpu" -s h -l help -d 'Print help'
complete -c metalift -n "__fish_metalift_using_subcommand schema" -l audit-record -d 'Print the JSON Schema of one audit log record (every kind) instead'
complete -c metalift -n "__fish_metalift_using_subcommand schema" -s h -l help -d 'Print help'
complete -c metalift -n "__fish_metalift_using_subcommand completions" -s h -l help -d 'Print help'
complete -c metalift -n "__fish_metalift_using_subcommand __generate-docs" -s h -l help -d 'Print help'
complete -c metalift -n "__fish_metalift_using_subcommand help; and not __fish_seen_subcommand_from validate explain status audit exec demo edit doctor verify gpu schema completions __generate-docs help" -f -a "validate" -d 'Check a policy file (and its policy.d/) and print every problem with its location'
complete -c metalift -n "__fish_metalift_using_subcommand help; and not __fish_seen_subcommand_from validate explain status audit exec demo edit doctor verify gpu schema completions __generate-docs help" -f -a "explain" -d 'Show which rule decides for an executable or a running process, and why'
complete -c metalift -n "__fish_metalift_using_subcommand help; and not __fish_seen_subcommand_from validate explain status audit exec demo edit doctor verify gpu schema completions __generate-docs help" -f -a "status" -d 'Show the running daemon\'s policy and counters'
complete -c metalift -n "__fish_metalift_using_subcommand help; and not __fish_seen_subcommand_from validate explain status audit exec demo edit doctor verify gpu schema completions __generate-docs help" -f -a "audit" -d 'Answers from the audit log: one line per process (decision joined with outcome), filters, summary'
complete -c metalift -n "__fish_metalift_using_subcommand help; and not __fish_seen_subcommand_from validate explain status audit exec demo edit doctor verify gpu schema completions __generate-docs help" -f -a "exec" -d 'Run a command with libmetalift injected (--require-unlock: fail unless it was unlocked)'
complete -c metalift -n "__fish_metalift_using_subcommand help; and not __fish_seen_subcommand_from validate explain status audit exec demo edit doctor verify gpu schema completions __generate-docs help" -f -a "demo" -d 'Start a throw-away daemon and show the shim\'s effect on the probe, end to end'
complete -c metalift -n "__fish_metalift_using_subcommand help; and not __fish_seen_subcommand_from validate explain status audit exec demo edit doctor verify gpu schema completions __generate-docs help" -f -a "edit" -d 'Edit the policy safely (visudo-style): lock, edit a copy, validate, install atomically'
complete -c metalift -n "__fish_metalift_using_subcommand help; and not __fish_seen_subcommand_from validate explain status audit exec demo edit doctor verify gpu schema completions __generate-docs help" -f -a "doctor" -d 'Check the installation: daemon, policy, audit log, shim, SIP, injection, rules\' executables'
complete -c metalift -n "__fish_metalift_using_subcommand help; and not __fish_seen_subcommand_from validate explain status audit exec demo edit doctor verify gpu schema completions __generate-docs help" -f -a "verify" -d 'Run a profile\'s kernels on this machine (under the shim) and record the result for require_verified'
complete -c metalift -n "__fish_metalift_using_subcommand help; and not __fish_seen_subcommand_from validate explain status audit exec demo edit doctor verify gpu schema completions __generate-docs help" -f -a "gpu" -d 'What the GPU answers with no unlock (families, threadgroup memory, name and class), the host chip, and which profiles it already meets'
complete -c metalift -n "__fish_metalift_using_subcommand help; and not __fish_seen_subcommand_from validate explain status audit exec demo edit doctor verify gpu schema completions __generate-docs help" -f -a "schema" -d 'Print the JSON Schema of a policy file (for taplo / Even Better TOML)'
complete -c metalift -n "__fish_metalift_using_subcommand help; and not __fish_seen_subcommand_from validate explain status audit exec demo edit doctor verify gpu schema completions __generate-docs help" -f -a "completions" -d 'Print the shell completion script for bash, zsh or fish'
complete -c metalift -n "__fish_metalift_using_subcommand help; and not __fish_seen_subcommand_from validate explain status audit exec demo edit doctor verify gpu schema completions __generate-docs help" -f -a "__generate-docs" -d 'Write the man pages and completion scripts under DIR (for the repository and the .pkg)'
complete -c metalift -n "__fish_metalift_using_subcommand help; and not __fish_seen_subcommand_from validate explain status audit exec demo edit doctor verify gpu schema completions __generate-docs help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c metalift -n "__fish_metalift_using_subcommand help; and __fish_seen_subcommand_from audit" -f -a "flush" -d 'Wait until every record written so far was delivered to the syslog collector'
complete -c metalift -n "__fish_metalift_using_subcommand help; and __fish_seen_subcommand_from audit" -f -a "export" -d 'Write a self-contained bundle (this boot\'s records, the daemon\'s status, the live policy, SHA256SUMS) into a directory, e.g. a CI artifact'
