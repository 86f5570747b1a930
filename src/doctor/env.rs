//! The NCCL settings a process on this machine would see, and where each comes from.
//!
//! NCCL reads its variables with `getenv` after loading two files once per process
//! (`src/misc/param.cc:55-70`, NCCL 2.28.9): `$NCCL_CONF_FILE` when set and non-empty,
//! else `~/.nccl.conf` (home of the *user id*, from the password database), then
//! `/etc/nccl.conf`. Each line `NAME=value` is applied with `setenv(NAME, value, 0)`,
//! so the process environment beats the first file, which beats `/etc/nccl.conf`, and
//! within a file the first line for a name wins. Lines starting with `#` and lines
//! without `=` are skipped; nothing is trimmed (`NCCL_X = 1` sets a variable named
//! `NCCL_X `, which NCCL never reads). Numeric parameters go through `strtoll(s, 0, 0)`
//! (`param.cc:78-93`): an empty value means "default", `abc` reads as 0, `0x2` as 2.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// One variable as the process would see it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Setting {
    pub name: String,
    pub value: String,
    /// `environment`, or the file it came from (`/etc/nccl.conf`, …).
    pub source: String,
    /// Values of the same name that lost (lower-precedence files), for the record.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shadowed: Vec<Shadowed>,
}

/// A value that a higher-precedence source overrode.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shadowed {
    pub value: String,
    pub source: String,
}

/// A configuration file NCCL would read, with its text (`None`: absent or unreadable).
#[derive(Clone, Debug)]
pub struct ConfFile {
    pub label: String,
    pub text: Option<String>,
}

/// The variables that matter to NCCL's data path, to torch's NCCL use, to which
/// libraries load, or to zcta itself.
pub fn is_relevant(name: &str) -> bool {
    const EXACT: [&str; 8] = [
        "CUDA_VISIBLE_DEVICES",
        "CUDA_DEVICE_ORDER",
        "NVIDIA_VISIBLE_DEVICES",
        "LD_PRELOAD",
        "LD_LIBRARY_PATH",
        "CUDA_HOME",
        "CUDA_PATH",
        "CUDA_MODULE_LOADING",
    ];
    name.starts_with("NCCL_")
        || name.starts_with("TORCH_NCCL_")
        || name.starts_with("ZCTA_")
        || EXACT.contains(&name)
}

/// `NAME=value` pairs of one file, in file order, as NCCL's `setEnvFile` reads them.
pub fn parse_conf(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for line in text.split('\n') {
        if line.starts_with('#') {
            continue;
        }
        let Some(eq) = line.find('=') else { continue };
        // NCCL copies at most 1023 bytes of each; names and values that long are
        // not worth modelling.
        out.push((line[..eq].to_owned(), line[eq + 1..].to_owned()));
    }
    out
}

/// Every relevant variable with its winning value and source. `env` is the process
/// environment; `files` are in NCCL's order (the `NCCL_CONF_FILE`/`~/.nccl.conf`
/// one first, then `/etc/nccl.conf`). Files only fill names the environment (or an
/// earlier line) did not set; every value they supply is recorded, winner or not.
pub fn resolve(env: &BTreeMap<String, String>, files: &[ConfFile]) -> Vec<Setting> {
    let mut out: BTreeMap<String, Setting> = BTreeMap::new();
    for (k, v) in env {
        if is_relevant(k) {
            out.insert(
                k.clone(),
                Setting {
                    name: k.clone(),
                    value: v.clone(),
                    source: "environment".into(),
                    shadowed: Vec::new(),
                },
            );
        }
    }
    for f in files {
        let Some(text) = &f.text else { continue };
        for (k, v) in parse_conf(text) {
            // NCCL sets every name in the file, relevant or not; report only ours,
            // plus names that look like a mistyped NCCL variable (spaces around).
            if !is_relevant(k.trim()) {
                continue;
            }
            match out.get_mut(&k) {
                Some(s) => s.shadowed.push(Shadowed {
                    value: v,
                    source: f.label.clone(),
                }),
                None => {
                    out.insert(
                        k.clone(),
                        Setting {
                            name: k,
                            value: v,
                            source: f.label.clone(),
                            shadowed: Vec::new(),
                        },
                    );
                }
            }
        }
    }
    out.into_values().collect()
}

/// The setting named `name`, exactly (NCCL does not trim names).
pub fn get<'a>(settings: &'a [Setting], name: &str) -> Option<&'a Setting> {
    settings.iter().find(|s| s.name == name)
}

/// Result of C's `strtoll(s, NULL, 0)`: the value (`None` on overflow, where errno is
/// ERANGE), whether any digit was read, and whether characters were left over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Strtoll {
    pub value: Option<i64>,
    pub digits: bool,
    pub trailing: bool,
}

/// C's `strtoll(s, NULL, 0)`: leading white space, a sign, `0x` hex, `0` octal, else
/// decimal; stops at the first character that is not a digit of the base.
pub fn strtoll(s: &str) -> Strtoll {
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() && matches!(b[i], b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c) {
        i += 1;
    }
    let neg = match b.get(i) {
        Some(b'-') => {
            i += 1;
            true
        }
        Some(b'+') => {
            i += 1;
            false
        }
        _ => false,
    };
    let (base, start) = if b.get(i) == Some(&b'0')
        && matches!(b.get(i + 1), Some(b'x' | b'X'))
        && b.get(i + 2).is_some_and(u8::is_ascii_hexdigit)
    {
        (16, i + 2)
    } else if b.get(i) == Some(&b'0') {
        (8, i)
    } else {
        (10, i)
    };
    let mut j = start;
    let mut acc: Option<i128> = Some(0);
    while let Some(d) = b.get(j).and_then(|c| (*c as char).to_digit(base)) {
        acc = acc
            .map(|a| a * i128::from(base) + i128::from(d))
            .filter(|a| *a <= i128::from(i64::MAX) + 1);
        j += 1;
    }
    let digits = j > start;
    let value = acc
        .map(|a| if neg { -a } else { a })
        .and_then(|a| i64::try_from(a).ok());
    Strtoll {
        value: if digits { value } else { Some(0) },
        digits,
        trailing: j < b.len(),
    }
}

/// How NCCL's `ncclLoadParam` reads an integer parameter (`param.cc:78`): unset or
/// empty → `default`; an overflowing value → `default`; else `strtoll`'s value.
pub fn nccl_param(settings: &[Setting], name: &str, default: i64) -> i64 {
    match get(settings, name) {
        Some(s) if !s.value.is_empty() => strtoll(&s.value).value.unwrap_or(default),
        _ => default,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn conf_lines_as_nccl_reads_them() {
        let text = "# comment\nNCCL_A=1\n #not a comment=x\nno equals sign\nNCCL_B = 2\nNCCL_C=x=y\nNCCL_D=\r\nNCCL_E=";
        let got = parse_conf(text);
        let want: Vec<(String, String)> = [
            ("NCCL_A", "1"),
            // Only a '#' in the first column makes a comment.
            (" #not a comment", "x"),
            // Nothing is trimmed.
            ("NCCL_B ", " 2"),
            ("NCCL_C", "x=y"),
            ("NCCL_D", "\r"),
            ("NCCL_E", ""),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn precedence_env_then_first_file_then_etc() {
        let files = vec![
            ConfFile {
                label: "/home/u/.nccl.conf".into(),
                text: Some("NCCL_CTA_POLICY=1\nNCCL_P2P_DISABLE=1\nNCCL_P2P_DISABLE=0\n".into()),
            },
            ConfFile {
                label: "/etc/nccl.conf".into(),
                text: Some("NCCL_CTA_POLICY=0\nNCCL_SHM_DISABLE=1\nOTHER=1\n".into()),
            },
        ];
        let s = resolve(&env(&[("NCCL_CTA_POLICY", "2"), ("PATH", "/bin")]), &files);
        let cta = get(&s, "NCCL_CTA_POLICY").unwrap();
        assert_eq!((cta.value.as_str(), cta.source.as_str()), ("2", "environment"));
        assert_eq!(cta.shadowed.len(), 2);
        assert_eq!(cta.shadowed[0].source, "/home/u/.nccl.conf");
        let p2p = get(&s, "NCCL_P2P_DISABLE").unwrap();
        assert_eq!(
            (p2p.value.as_str(), p2p.source.as_str()),
            ("1", "/home/u/.nccl.conf")
        );
        assert_eq!(p2p.shadowed[0].value, "0", "the first line of a file wins");
        assert_eq!(get(&s, "NCCL_SHM_DISABLE").unwrap().source, "/etc/nccl.conf");
        assert!(get(&s, "PATH").is_none() && get(&s, "OTHER").is_none());
    }

    #[test]
    fn spaced_names_are_kept_verbatim() {
        let files = vec![ConfFile {
            label: "/etc/nccl.conf".into(),
            text: Some("NCCL_CTA_POLICY = 2\n".into()),
        }];
        let s = resolve(&BTreeMap::new(), &files);
        assert!(get(&s, "NCCL_CTA_POLICY").is_none());
        assert_eq!(get(&s, "NCCL_CTA_POLICY ").unwrap().value, " 2");
    }

    #[test]
    fn strtoll_like_c() {
        let v = |s: &str| strtoll(s).value;
        assert_eq!(v("2"), Some(2));
        assert_eq!(v(" 2"), Some(2));
        assert_eq!(v("0x2"), Some(2));
        assert_eq!(v("010"), Some(8));
        assert_eq!(v("-1"), Some(-1));
        assert_eq!(v("2abc"), Some(2));
        assert!(strtoll("2abc").trailing);
        assert_eq!(v("abc"), Some(0));
        assert!(!strtoll("abc").digits);
        assert_eq!(v("0x"), Some(0));
        assert!(strtoll("0x").trailing);
        assert_eq!(v("99999999999999999999"), None);
        assert_eq!(v("-9223372036854775808"), Some(i64::MIN));
        assert!(!strtoll("2").trailing && strtoll("2\r").trailing);
    }

    #[test]
    fn params_default_when_unset_or_empty() {
        let s = resolve(
            &env(&[
                ("NCCL_WIN_ENABLE", ""),
                ("NCCL_CUMEM_ENABLE", "0"),
                ("NCCL_X", "zero"),
            ]),
            &[],
        );
        assert_eq!(nccl_param(&s, "NCCL_WIN_ENABLE", 1), 1);
        assert_eq!(nccl_param(&s, "NCCL_CUMEM_ENABLE", -2), 0);
        assert_eq!(nccl_param(&s, "NCCL_X", 7), 0, "strtoll reads 'zero' as 0");
        assert_eq!(nccl_param(&s, "NCCL_UNSET", -2), -2);
    }
}
