//! Throw-away system users for the tests of who may profile what (root
//! only): created with `useradd`, removed with `userdel` when dropped, also
//! when a test fails.

use std::process::{Command, Stdio};

fn remove_user(name: &str) {
    let _ = Command::new("userdel")
        .arg(name)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// The named users, created fresh (left-overs of an earlier run removed
/// first); removed again when dropped.
#[derive(Debug)]
pub struct TestUsers {
    names: Vec<&'static str>,
}

impl TestUsers {
    /// Creates `names` (no home, `/bin/sh`); panics if `useradd` fails.
    pub fn create(names: &[&'static str]) -> TestUsers {
        for u in names {
            remove_user(u);
        }
        let guard = TestUsers {
            names: names.to_vec(),
        };
        for u in names {
            let st = Command::new("useradd")
                .args(["--no-create-home", "--shell", "/bin/sh", u])
                .status()
                .expect("useradd");
            assert!(st.success(), "useradd {u}: {st}");
        }
        guard
    }
}

impl Drop for TestUsers {
    fn drop(&mut self) {
        for u in &self.names {
            remove_user(u);
        }
    }
}

/// The uid of user `name` (`id -u`).
pub fn uid_of(name: &str) -> u32 {
    let out = Command::new("id")
        .args(["-u", name])
        .output()
        .expect("id -u");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("a uid")
}
