//! Command-line parsing shared by the bench binaries: `--help`, and a usage
//! error (exit code 2) instead of a panic for an unknown option or a bad
//! value.

use std::collections::HashMap;
use std::str::FromStr;

/// The options given on the command line, checked against a usage text.
#[derive(Debug)]
pub struct BenchArgs {
    usage: &'static str,
    given: HashMap<String, Option<String>>,
}

impl BenchArgs {
    /// Parses `std::env::args()`. `options` lists every option as it is
    /// written in the usage: `"--reps N"` takes a value, `"--no-heaptrack"`
    /// does not. `--help` prints `usage` and exits 0.
    pub fn parse(usage: &'static str, options: &[&str]) -> Self {
        let mut given = HashMap::new();
        let mut args = std::env::args().skip(1);
        while let Some(a) = args.next() {
            if a == "-h" || a == "--help" {
                println!("{usage}");
                std::process::exit(0);
            }
            let Some(spec) = options.iter().find(|o| o.split(' ').next() == Some(&a)) else {
                usage_error(usage, &format!("unknown option `{a}`"));
            };
            let value = if spec.contains(' ') {
                match args.next() {
                    Some(v) => Some(v),
                    None => usage_error(usage, &format!("`{spec}` needs a value")),
                }
            } else {
                None
            };
            given.insert(a, value);
        }
        BenchArgs { usage, given }
    }

    /// Whether a flag was given.
    pub fn flag(&self, name: &str) -> bool {
        self.given.contains_key(name)
    }

    /// The value of `name` parsed as `T`, or `default` when not given.
    pub fn value<T: FromStr>(&self, name: &str, default: T) -> T {
        match self.given.get(name) {
            Some(Some(v)) => v.parse().unwrap_or_else(|_| {
                usage_error(self.usage, &format!("bad value `{v}` for `{name}`"))
            }),
            _ => default,
        }
    }

    /// The comma-separated values of `name`, or `default` when not given.
    pub fn list<T: FromStr>(&self, name: &str, default: Vec<T>) -> Vec<T> {
        match self.given.get(name) {
            Some(Some(v)) => v
                .split(',')
                .map(|x| {
                    x.trim().parse().unwrap_or_else(|_| {
                        usage_error(self.usage, &format!("bad value `{x}` in `{name} {v}`"))
                    })
                })
                .collect(),
            _ => default,
        }
    }
}

/// Prints `msg` and the usage to stderr and exits with code 2.
fn usage_error(usage: &str, msg: &str) -> ! {
    eprintln!("error: {msg}\n\n{usage}");
    std::process::exit(2)
}
