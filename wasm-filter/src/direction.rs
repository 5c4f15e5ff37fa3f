//! Which way a connection goes: decoded from Envoy's `xds.listener_direction` property.
//!
//! Envoy serves the listener's `traffic_direction` as an i64 in little-endian bytes at the property
//! path [`LISTENER_DIRECTION_PATH`]: 0 unspecified, 1 INBOUND, 2 OUTBOUND. (The pre-1.2x path
//! `["listener_direction"]` answers nothing in Envoy 1.40.)

use serde::Deserialize;

/// The property path that holds the listener's traffic direction.
pub const LISTENER_DIRECTION_PATH: [&str; 2] = ["xds", "listener_direction"];

/// The direction a connection is counted under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    /// The listener's traffic_direction is INBOUND (Istio's 15006 virtual inbound listener).
    Inbound,
    /// The listener's traffic_direction is OUTBOUND (Istio's 15001 virtual outbound listener).
    Outbound,
    /// The listener has no direction (or the property could not be read).
    Unknown,
}

impl Direction {
    /// Every direction, in the order metric tables are indexed by [`Direction::index`].
    pub const ALL: [Direction; 3] = [Direction::Inbound, Direction::Outbound, Direction::Unknown];

    /// The name used in stat names (`holdfast.<name>.cx_active`).
    pub const fn as_str(self) -> &'static str {
        match self {
            Direction::Inbound => "inbound",
            Direction::Outbound => "outbound",
            Direction::Unknown => "unknown",
        }
    }

    /// Position in [`Direction::ALL`], for fixed-size per-direction tables.
    pub const fn index(self) -> usize {
        match self {
            Direction::Inbound => 0,
            Direction::Outbound => 1,
            Direction::Unknown => 2,
        }
    }

    /// Decodes the raw property value. `None` (property absent), a value of the wrong size and
    /// any number other than 1 or 2 all mean [`Direction::Unknown`]: a filter that cannot tell
    /// still counts the connection, just not under a direction.
    pub fn from_property(raw: Option<&[u8]>) -> Direction {
        let Some(bytes) = raw else {
            return Direction::Unknown;
        };
        let Ok(le) = <[u8; 8]>::try_from(bytes) else {
            return Direction::Unknown;
        };
        match i64::from_le_bytes(le) {
            1 => Direction::Inbound,
            2 => Direction::Outbound,
            _ => Direction::Unknown,
        }
    }

    /// The direction to count a connection under: the listener's own direction when it has one,
    /// else the configured override for listeners without `traffic_direction`, else unknown.
    pub fn resolve(raw: Option<&[u8]>, override_unset: Option<Direction>) -> Direction {
        match Direction::from_property(raw) {
            Direction::Unknown => override_unset.unwrap_or(Direction::Unknown),
            known => known,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn le(v: i64) -> [u8; 8] {
        v.to_le_bytes()
    }

    #[test]
    fn decodes_envoy_values() {
        assert_eq!(Direction::from_property(Some(&le(1))), Direction::Inbound);
        assert_eq!(Direction::from_property(Some(&le(2))), Direction::Outbound);
        assert_eq!(Direction::from_property(Some(&le(0))), Direction::Unknown);
    }

    #[test]
    fn odd_values_are_unknown_not_errors() {
        assert_eq!(Direction::from_property(None), Direction::Unknown);
        assert_eq!(Direction::from_property(Some(&[])), Direction::Unknown);
        assert_eq!(Direction::from_property(Some(&[1])), Direction::Unknown);
        assert_eq!(
            Direction::from_property(Some(&[1, 0, 0, 0])),
            Direction::Unknown
        );
        assert_eq!(Direction::from_property(Some(&le(3))), Direction::Unknown);
        assert_eq!(Direction::from_property(Some(&le(-1))), Direction::Unknown);
        assert_eq!(Direction::from_property(Some(&[1; 9])), Direction::Unknown);
        // Big-endian 1 is not 1.
        assert_eq!(
            Direction::from_property(Some(&1i64.to_be_bytes())),
            Direction::Unknown
        );
    }

    #[test]
    fn override_applies_only_to_listeners_without_direction() {
        let ob = Some(Direction::Outbound);
        assert_eq!(Direction::resolve(Some(&le(1)), ob), Direction::Inbound);
        assert_eq!(Direction::resolve(Some(&le(0)), ob), Direction::Outbound);
        assert_eq!(Direction::resolve(None, ob), Direction::Outbound);
        assert_eq!(Direction::resolve(None, None), Direction::Unknown);
    }

    #[test]
    fn index_matches_all() {
        for (i, d) in Direction::ALL.iter().enumerate() {
            assert_eq!(d.index(), i);
        }
    }
}
