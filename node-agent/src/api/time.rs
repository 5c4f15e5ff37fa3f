//! Serde helpers for the wire format: RFC 3339 timestamps and millisecond durations.

/// Timestamps in the status document are RFC 3339 strings in UTC (`2026-11-22T06:00:37.458Z`),
/// as Kubernetes writes them.
pub mod rfc3339 {
    use std::time::SystemTime;

    use k8s_openapi::jiff::Timestamp;
    use serde::{Deserialize, Deserializer, Serializer};

    /// `t` as the document writes it (also for `holdfast status POD`).
    pub fn format(t: SystemTime) -> String {
        Timestamp::try_from(t)
            .map(|ts| {
                ts.round(k8s_openapi::jiff::Unit::Millisecond)
                    .unwrap_or(ts)
                    .to_string()
            })
            .unwrap_or_default()
    }

    fn parse<E: serde::de::Error>(s: &str) -> Result<SystemTime, E> {
        s.parse::<Timestamp>()
            .map(SystemTime::from)
            .map_err(|e| E::custom(format!("invalid RFC 3339 timestamp {s:?}: {e}")))
    }

    pub fn serialize<S: Serializer>(t: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format(*t))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<SystemTime, D::Error> {
        parse(&String::deserialize(d)?)
    }

    /// The same for optional timestamps (`null` when absent).
    pub mod option {
        use super::*;

        pub fn serialize<S: Serializer>(t: &Option<SystemTime>, s: S) -> Result<S::Ok, S::Error> {
            match t {
                Some(t) => s.serialize_some(&format(*t)),
                None => s.serialize_none(),
            }
        }

        pub fn deserialize<'de, D: Deserializer<'de>>(
            d: D,
        ) -> Result<Option<SystemTime>, D::Error> {
            Option::<String>::deserialize(d)?
                .map(|s| parse(&s))
                .transpose()
        }
    }
}

/// Durations as milliseconds (`f64`) in reports.
pub mod ms {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64() * 1e3)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let ms = f64::deserialize(d)?;
        Duration::try_from_secs_f64(ms / 1e3).map_err(serde::de::Error::custom)
    }
}

/// Optional durations as milliseconds (`f64` or `null`) in reports.
pub mod opt_ms {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_some(&(d.as_secs_f64() * 1e3)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        Option::<f64>::deserialize(d)?
            .map(|ms| Duration::try_from_secs_f64(ms / 1e3).map_err(serde::de::Error::custom))
            .transpose()
    }
}
