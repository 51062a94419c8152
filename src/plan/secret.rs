//! The split secret: what binds a side entry to the group's own commit (DESIGN §3, trust).
//!
//! The side topic is shared by every group that uses it, so anyone who can write to it could
//! write an entry under another group's key. Epoch and boundary are guessable (epochs count
//! up, the boundary is a log end anyone can list), so they cannot be what makes an entry
//! trusted. At each split a random 128-bit secret goes into the split token, which lives in
//! the group's commit metadata (readable only with Describe on the group); every side entry
//! carries an HMAC-SHA-256 of its key and contents under that secret. An entry that does not
//! verify is stale.

use std::fmt;

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Bytes of the secret (128 bits).
const SECRET_BYTES: usize = 16;
/// Bytes of the MAC kept in a side entry (HMAC-SHA-256 truncated to 128 bits).
pub const MAC_BYTES: usize = 16;

/// A split's random secret. Its `Debug` form is redacted: decisions are logged.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct SplitSecret([u8; SECRET_BYTES]);

impl fmt::Debug for SplitSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SplitSecret(<redacted>)")
    }
}

impl SplitSecret {
    /// A fresh secret from the operating system's random source. The only call in `plan`
    /// that is not pure: adapters call it and hand the value to [`crate::plan::reconcile`].
    pub fn random() -> Result<Self, getrandom::Error> {
        let mut bytes = [0; SECRET_BYTES];
        getrandom::fill(&mut bytes)?;
        Ok(Self(bytes))
    }

    /// A fixed secret (tests, simulations).
    pub const fn from_bytes(bytes: [u8; SECRET_BYTES]) -> Self {
        Self(bytes)
    }

    /// Lower-case hex, as it appears in the token.
    pub fn to_hex(&self) -> String {
        to_hex(&self.0)
    }

    /// Parses exactly 32 hex digits.
    pub fn from_hex(text: &str) -> Option<Self> {
        from_hex(text).map(Self)
    }

    /// The MAC of a side entry: HMAC-SHA-256 over the key (length-prefixed, so no two
    /// key/body pairs share an input) and the entry's text, truncated to 128 bits.
    pub fn mac(&self, key: &str, body: &str) -> [u8; MAC_BYTES] {
        let tag = self.hmac(key, body).finalize().into_bytes();
        let mut mac = [0; MAC_BYTES];
        mac.copy_from_slice(&tag[..MAC_BYTES]);
        mac
    }

    /// Whether `mac` is the MAC of `key` and `body` (compared in constant time).
    pub fn verifies(&self, key: &str, body: &str, mac: &[u8; MAC_BYTES]) -> bool {
        self.hmac(key, body).verify_truncated_left(mac).is_ok()
    }

    fn hmac(&self, key: &str, body: &str) -> Hmac<Sha256> {
        // new_from_slice accepts any key length; 16 bytes cannot fail.
        let mut hmac = <Hmac<Sha256> as Mac>::new_from_slice(&self.0)
            .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
        hmac.update(&(key.len() as u64).to_be_bytes());
        hmac.update(key.as_bytes());
        hmac.update(body.as_bytes());
        hmac
    }
}

/// Lower-case hex of `bytes`.
pub(crate) fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Exactly `N` bytes from `2 N` hex digits (either case); `None` otherwise.
pub(crate) fn from_hex<const N: usize>(text: &str) -> Option<[u8; N]> {
    if text.len() != 2 * N || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let mut bytes = [0; N];
    for (byte, pair) in bytes.iter_mut().zip(text.as_bytes().chunks(2)) {
        let pair = std::str::from_utf8(pair).ok()?;
        *byte = u8::from_str_radix(pair, 16).ok()?;
    }
    Some(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips_and_rejects_anything_else() {
        let secret = SplitSecret::from_bytes(*b"0123456789abcdef");
        let hex = secret.to_hex();
        assert_eq!(hex, "30313233343536373839616263646566");
        assert_eq!(SplitSecret::from_hex(&hex), Some(secret));
        for bad in [
            "",
            "30",
            &hex[1..],
            &format!("{hex}00"),
            &hex.replace('3', "g"),
        ] {
            assert_eq!(SplitSecret::from_hex(bad), None, "{bad:?}");
        }
        assert_eq!(
            SplitSecret::from_hex("+0313233343536373839616263646566"),
            None
        );
        assert_eq!(format!("{secret:?}"), "SplitSecret(<redacted>)");
    }

    #[test]
    fn the_mac_binds_secret_key_and_body() {
        let secret = SplitSecret::from_bytes([7; 16]);
        let other = SplitSecret::from_bytes([8; 16]);
        let mac = secret.mac("g/t/0", "body");
        assert!(secret.verifies("g/t/0", "body", &mac));
        assert!(!other.verifies("g/t/0", "body", &mac));
        assert!(!secret.verifies("g/t/1", "body", &mac));
        assert!(!secret.verifies("g/t/0", "bodY", &mac));
        // The key is length-prefixed: moving a byte between key and body changes the input.
        assert!(!secret.verifies("g/t/0b", "ody", &mac));
    }

    #[test]
    fn random_secrets_differ() {
        let (a, b) = (SplitSecret::random(), SplitSecret::random());
        assert!(matches!((a, b), (Ok(a), Ok(b)) if a != b));
    }
}
