//! TOML configuration with errors a person can act on.
//!
//! Every config struct derives `Deserialize` with `deny_unknown_fields` and implements
//! [`Validate`] for ranges serde cannot express. A wrong key, a wrong type or a value out of range
//! becomes one [`ConfigError`] that names the file, the dotted key and what is allowed.

use serde::de::DeserializeOwned;
use std::fmt::Display;
use std::path::Path;

/// A configuration problem, naming the file and key at fault.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("config file `{file}`: cannot read it: {source}")]
    Read {
        /// File at fault.
        file: String,
        /// I/O error.
        source: std::io::Error,
    },
    /// TOML syntax error, unknown key or wrong type.
    #[error("config file `{file}`: key `{key}`: {message}")]
    Parse {
        /// File at fault.
        file: String,
        /// Dotted key path (`.` for the top level).
        key: String,
        /// What the parser said, including the allowed keys or variants where serde knows them.
        message: String,
    },
    /// A value of the right type outside its allowed range.
    #[error("config file `{file}`: key `{key}` = {value} is out of range; allowed: {allowed}")]
    Invalid {
        /// File at fault.
        file: String,
        /// Dotted key path.
        key: String,
        /// The value found.
        value: String,
        /// The allowed values, in words.
        allowed: String,
    },
}

/// A value outside its allowed range, before the file name is attached.
#[derive(Debug, Clone, PartialEq)]
pub struct Invalid {
    /// Dotted key path.
    pub key: String,
    /// The value found.
    pub value: String,
    /// The allowed values, in words.
    pub allowed: String,
}

/// Range checks beyond what the types express.
pub trait Validate {
    /// Returns the first value out of range. `prefix` is the dotted path of this table (`""` at
    /// the top level), to be joined with field names via [`key`].
    fn validate(&self, prefix: &str) -> Result<(), Invalid>;
}

/// Joins a table prefix and a field name into a dotted key.
pub fn key(prefix: &str, field: &str) -> String {
    if prefix.is_empty() {
        field.to_string()
    } else {
        format!("{prefix}.{field}")
    }
}

/// Checks `lo <= value <= hi`.
pub fn in_range<T: PartialOrd + Display>(
    prefix: &str,
    field: &str,
    value: T,
    lo: T,
    hi: T,
) -> Result<(), Invalid> {
    if value >= lo && value <= hi {
        Ok(())
    } else {
        Err(Invalid {
            key: key(prefix, field),
            value: value.to_string(),
            allowed: format!("{lo} ..= {hi}"),
        })
    }
}

/// Parses TOML text; `file` names it in errors.
pub fn parse<T: DeserializeOwned + Validate>(text: &str, file: &str) -> Result<T, ConfigError> {
    let de = toml::Deserializer::new(text);
    let value: T = serde_path_to_error::deserialize(de).map_err(|e| {
        let key = e.path().to_string();
        ConfigError::Parse {
            file: file.to_string(),
            key,
            message: e.into_inner().to_string().trim().to_string(),
        }
    })?;
    value.validate("").map_err(|i| ConfigError::Invalid {
        file: file.to_string(),
        key: i.key,
        value: i.value,
        allowed: i.allowed,
    })?;
    Ok(value)
}

/// Reads and parses a TOML config file.
pub fn load<T: DeserializeOwned + Validate>(path: &Path) -> Result<T, ConfigError> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        file: file.clone(),
        source,
    })?;
    parse(&text, &file)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Top {
        sim: Sim,
    }
    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "snake_case")]
    enum Task {
        Reach,
        Pick,
    }
    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Sim {
        task: Task,
        #[serde(default = "hz")]
        control_hz: f64,
    }
    fn hz() -> f64 {
        20.0
    }
    impl Validate for Top {
        fn validate(&self, p: &str) -> Result<(), Invalid> {
            in_range(
                &key(p, "sim"),
                "control_hz",
                self.sim.control_hz,
                1.0,
                100.0,
            )
        }
    }

    #[test]
    fn good_file_parses() {
        let t: Top = parse("[sim]\ntask = \"pick\"\n", "a.toml").unwrap();
        assert!(matches!(t.sim.task, Task::Pick));
        assert_eq!(t.sim.control_hz, 20.0);
    }

    #[test]
    fn unknown_key_names_file_key_and_allowed_keys() {
        let e = parse::<Top>("[sim]\ntask = \"pick\"\ncontrol_hzz = 3\n", "cfg/a.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("cfg/a.toml"), "{e}");
        assert!(e.contains("control_hzz") && e.contains("control_hz"), "{e}");
    }

    #[test]
    fn wrong_type_names_the_key() {
        let e = parse::<Top>("[sim]\ntask = 5\n", "a.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("sim.task"), "{e}");
    }

    #[test]
    fn bad_variant_lists_the_allowed_values() {
        let e = parse::<Top>("[sim]\ntask = \"pik\"\n", "a.toml")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("sim.task") && e.contains("reach") && e.contains("pick"),
            "{e}"
        );
    }

    #[test]
    fn out_of_range_names_the_key_and_range() {
        let e = parse::<Top>("[sim]\ntask = \"pick\"\ncontrol_hz = 500.0\n", "a.toml")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("sim.control_hz") && e.contains("500") && e.contains("1 ..= 100"),
            "{e}"
        );
    }

    #[test]
    fn missing_file_names_it() {
        let e = load::<Top>(Path::new("/nonexistent/reflex.toml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("/nonexistent/reflex.toml"), "{e}");
    }
}
