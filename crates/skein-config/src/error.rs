//! `ConfigError`: one or more problems, each naming the key it is about.

use std::fmt;

#[derive(Debug, Clone, PartialEq)]
pub struct ConfigError {
    problems: Vec<String>,
}

impl ConfigError {
    pub fn new(message: impl Into<String>) -> Self {
        ConfigError {
            problems: vec![message.into()],
        }
    }

    /// Several problems reported together, so a user fixes them in one go.
    pub fn many(problems: Vec<String>) -> Self {
        ConfigError { problems }
    }

    /// Each problem's message, in the order found.
    pub fn problems(&self) -> &[String] {
        &self.problems
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.problems.as_slice() {
            [one] => f.write_str(one),
            many => {
                write!(f, "{} problems in the configuration:", many.len())?;
                for p in many {
                    write!(f, "\n  - {p}")?;
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for ConfigError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_problem_reads_as_itself_several_as_a_list() {
        assert_eq!(ConfigError::new("bad `a`").to_string(), "bad `a`");
        let e = ConfigError::many(vec!["bad `a`".into(), "bad `b`".into()]);
        assert_eq!(
            e.to_string(),
            "2 problems in the configuration:\n  - bad `a`\n  - bad `b`"
        );
        assert_eq!(e.problems().len(), 2);
    }
}
