//! `[trajectories]`: what a run keeps of each step's trajectories for `skein view` (written by
//! `trajectory_log.rs`).

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;

/// `[trajectories]`: what a run keeps of each step's trajectories for `skein view`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrajectoriesConfig {
    /// `"all"`, `"none"`, or a number N: the first N of each step (groups in order, so whole
    /// groups when N is a multiple of `rollout.samples_per_prompt`).
    pub keep: Keep,
}

/// `trajectories.keep`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Keep {
    #[default]
    All,
    First(usize),
    None,
}

impl Keep {
    /// How many of `available` trajectories a step keeps.
    pub fn count(self, available: usize) -> usize {
        match self {
            Keep::All => available,
            Keep::First(n) => n.min(available),
            Keep::None => 0,
        }
    }
}

impl Serialize for Keep {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Keep::All => s.serialize_str("all"),
            Keep::None => s.serialize_str("none"),
            Keep::First(n) => s.serialize_u64(*n as u64),
        }
    }
}

impl<'de> Deserialize<'de> for Keep {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Keep, D::Error> {
        struct KeepVisitor;
        impl Visitor<'_> for KeepVisitor {
            type Value = Keep;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("\"all\", \"none\" or a number of trajectories per step")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Keep, E> {
                match v {
                    "all" => Ok(Keep::All),
                    "none" => Ok(Keep::None),
                    _ => Err(E::invalid_value(de::Unexpected::Str(v), &self)),
                }
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Keep, E> {
                Ok(Keep::First(usize::try_from(v).unwrap_or(usize::MAX)))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Keep, E> {
                match u64::try_from(v) {
                    Ok(v) => self.visit_u64(v),
                    Err(_) => Err(E::invalid_value(de::Unexpected::Signed(v), &self)),
                }
            }
        }
        d.deserialize_any(KeepVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keep_reads_words_and_counts_and_names_the_allowed_values() {
        let keep = |s: &str| -> Result<Keep, String> {
            toml::from_str::<TrajectoriesConfig>(s)
                .map(|c| c.keep)
                .map_err(|e| e.to_string())
        };
        assert_eq!(keep("keep = \"all\"").unwrap(), Keep::All);
        assert_eq!(keep("keep = \"none\"").unwrap(), Keep::None);
        assert_eq!(keep("keep = 16").unwrap(), Keep::First(16));
        assert_eq!(keep("").unwrap(), Keep::All);
        for bad in ["keep = \"some\"", "keep = -1", "keep = 2.5"] {
            let err = keep(bad).unwrap_err();
            assert!(
                err.contains("\"all\", \"none\" or a number of trajectories per step"),
                "{bad}: {err}"
            );
        }
        assert_eq!(Keep::First(3).count(10), 3);
        assert_eq!(Keep::First(30).count(10), 10);
        assert_eq!(Keep::None.count(10), 0);
        let round = toml::to_string(&TrajectoriesConfig {
            keep: Keep::First(4),
        })
        .unwrap();
        assert_eq!(keep(&round).unwrap(), Keep::First(4));
    }
}
