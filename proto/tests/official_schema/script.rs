//! Running `tests/check_trace.py` and handing it temp files.

use std::io::Write;
use std::path::Path;
use std::process::Command;

use serde_json::Value;

pub(crate) const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/check_trace.py");

/// What a run of check_trace.py produced.
pub(crate) struct Run {
    pub(crate) code: i32,
    pub(crate) json: Value,
    pub(crate) stderr: String,
}

pub(crate) fn python() -> String {
    std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_owned())
}

/// Runs check_trace.py with `args`; panics with install instructions if
/// python3 or the perfetto package is missing.
pub(crate) fn run_script_env(args: &[&str], pythonpath: Option<&Path>) -> Run {
    let mut cmd = Command::new(python());
    cmd.arg(SCRIPT).args(args);
    if let Some(dir) = pythonpath {
        cmd.env("PYTHONPATH", dir);
    }
    let out = cmd.output().unwrap_or_else(|e| {
        panic!(
            "cannot run `{}` ({e}): these tests need python3 with the official \
             Perfetto protos: pip install perfetto",
            python()
        )
    });
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let code = out.status.code().unwrap_or(-1);
    let json = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    Run { code, json, stderr }
}

pub(crate) fn run_script(args: &[&str]) -> Run {
    let run = run_script_env(args, None);
    assert_ne!(
        run.code, 3,
        "check_trace.py could not load the official Perfetto protos; \
         pip install perfetto\n{}",
        run.stderr
    );
    assert!(
        run.json.is_object(),
        "check_trace.py printed no JSON (exit {}):\n{}",
        run.code,
        run.stderr
    );
    run
}

pub(crate) fn write_temp(bytes: &[u8]) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().expect("temp file");
    f.write_all(bytes).expect("write temp file");
    f.flush().expect("flush temp file");
    f
}

pub(crate) fn path_arg(f: &tempfile::NamedTempFile) -> String {
    f.path().to_str().expect("utf-8 temp path").to_owned()
}

pub(crate) fn str_list(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|s| s.as_str().expect("string").to_owned())
        .collect()
}
