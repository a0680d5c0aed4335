//! SCRAM-SHA-256 verifiers of the roles' passwords, computed here so that a password never
//! reaches the server in clear: PostgreSQL stores a verifier given to `ALTER ROLE ... PASSWORD`
//! as it is, so neither a statement log nor the statement quoted with an error holds the
//! password. The format is PostgreSQL's (`scram_build_secret`, RFC 5802 / 7677):
//! `SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>`, base64.

use aws_lc_rs::{digest, hmac, pbkdf2, rand::SecureRandom};
use base64::Engine as _;
use std::num::NonZeroU32;

/// PostgreSQL's default `scram_iterations`.
pub const ITERATIONS: u32 = 4096;

/// PostgreSQL's salt length.
const SALT_LEN: usize = 16;

/// A verifier of `password` under a fresh random salt.
pub fn verifier(password: &str) -> anyhow::Result<String> {
    let mut salt = [0u8; SALT_LEN];
    aws_lc_rs::rand::SystemRandom::new()
        .fill(&mut salt)
        .map_err(|_| anyhow::anyhow!("no random salt could be drawn"))?;
    verifier_with(password, &salt, ITERATIONS)
}

/// The verifier of `password` under `salt` and `iterations`.
///
/// Only printable ASCII is taken (what Secrets Manager generates): PostgreSQL normalises other
/// passwords with SASLprep before hashing, and a client that did not would not log in.
pub fn verifier_with(password: &str, salt: &[u8], iterations: u32) -> anyhow::Result<String> {
    anyhow::ensure!(
        password.bytes().all(|b| (0x20..=0x7e).contains(&b)),
        "a role password must be printable ASCII"
    );
    let rounds = NonZeroU32::new(iterations)
        .ok_or_else(|| anyhow::anyhow!("SCRAM needs at least one iteration"))?;
    let mut salted = [0u8; 32];
    pbkdf2::derive(
        pbkdf2::PBKDF2_HMAC_SHA256,
        rounds,
        salt,
        password.as_bytes(),
        &mut salted,
    );
    let key = hmac::Key::new(hmac::HMAC_SHA256, &salted);
    let client_key = hmac::sign(&key, b"Client Key");
    let stored_key = digest::digest(&digest::SHA256, client_key.as_ref());
    let server_key = hmac::sign(&key, b"Server Key");
    let b64 = base64::engine::general_purpose::STANDARD;
    Ok(format!(
        "SCRAM-SHA-256${iterations}:{}${}:{}",
        b64.encode(salt),
        b64.encode(stored_key.as_ref()),
        b64.encode(server_key.as_ref())
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Computed independently (Python's hashlib.pbkdf2_hmac and hmac), and that computation
    /// checked against a verifier PostgreSQL 15 built for a role it was given 'pencil'.
    #[test]
    fn the_verifier_is_postgresqls_scram_sha_256_secret() {
        let salt: Vec<u8> = (0..16).collect();
        assert_eq!(
            verifier_with("pencil", &salt, 4096).unwrap(),
            "SCRAM-SHA-256$4096:AAECAwQFBgcICQoLDA0ODw==\
             $zHCdol2044/ZyWzPLi7oxApCkamKw9Z+E4U/QApd/5Y=\
             :dd5peBOitVnLNFu7VmwP+HiDaaw4OUCv396eVCWhYiE="
        );
    }

    #[test]
    fn each_verifier_has_its_own_salt_and_never_the_password() {
        let (a, b) = (verifier("hunter2").unwrap(), verifier("hunter2").unwrap());
        assert_ne!(a, b);
        assert!(a.starts_with("SCRAM-SHA-256$4096:") && !a.contains("hunter2"));
    }

    #[test]
    fn a_password_postgresql_would_normalise_is_refused() {
        for pw in ["pässwort", "tab\there", "new\nline"] {
            assert!(verifier(pw).is_err(), "{pw:?}");
        }
    }
}
