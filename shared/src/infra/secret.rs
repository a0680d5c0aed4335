//! Secrets that redact themselves: a type holding one is safe to `#[derive(Debug)]`.
//!
//! Plain secrets (a token, a password) are `secrecy`'s [`SecretString`]: `Debug` prints
//! `[REDACTED]`, the value is zeroed when dropped, and reading it takes an explicit
//! [`ExposeSecret::expose_secret`]. A URL that may carry a password or a token is a
//! [`SecretUrl`]: its `Debug` shows the URL with those parts masked (`user:***@host`), which
//! is what a log line or an error message needs to be useful and safe.

pub use secrecy::{ExposeSecret, SecretString};

/// A connection URL that may carry a password (in its user info) or a token (in its query).
#[derive(Clone, Default)]
pub struct SecretUrl(SecretString);

impl SecretUrl {
    pub fn new(url: impl Into<String>) -> Self {
        Self(SecretString::from(url.into()))
    }

    /// The URL, password and all: for the client that connects with it, never for a log.
    pub fn expose(&self) -> &str {
        self.0.expose_secret()
    }

    /// The URL with its password and tokens masked.
    pub fn redacted(&self) -> String {
        redacted(self.expose())
    }

    pub fn is_empty(&self) -> bool {
        self.expose().is_empty()
    }
}

impl std::fmt::Debug for SecretUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl From<&str> for SecretUrl {
    fn from(url: &str) -> Self {
        Self::new(url)
    }
}

impl From<String> for SecretUrl {
    fn from(url: String) -> Self {
        Self::new(url)
    }
}

impl PartialEq for SecretUrl {
    fn eq(&self, other: &Self) -> bool {
        self.expose() == other.expose()
    }
}

impl Eq for SecretUrl {}

impl PartialEq<&str> for SecretUrl {
    fn eq(&self, other: &&str) -> bool {
        self.expose() == *other
    }
}

/// `url` with the password of its user info and the values of `password`, `token`, `auth`
/// and `pass` query parameters replaced by `***`; anything not shaped like a URL is `***`.
pub fn redacted(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "***".into();
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let authority = match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _password)) => format!("{user}:***@{host}"),
            None => format!("{userinfo}@{host}"),
        },
        None => authority.to_string(),
    };
    let tail = match tail.split_once('?') {
        Some((path, query)) => {
            let query: Vec<String> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((k, _))
                        if ["password", "token", "auth", "pass"]
                            .contains(&k.to_ascii_lowercase().as_str()) =>
                    {
                        format!("{k}=***")
                    }
                    _ => pair.to_string(),
                })
                .collect();
            format!("{path}?{}", query.join("&"))
        }
        None => tail.to_string(),
    };
    format!("{scheme}://{authority}{tail}")
}

/// Percent-encodes everything but RFC 3986's unreserved characters: a user name or password
/// put into a URL's user info.
pub fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacted_hides_passwords_and_keeps_the_rest() {
        assert_eq!(
            redacted("postgres://seckill:s3cr%40t@proxy:5432/seckill?sslmode=require"),
            "postgres://seckill:***@proxy:5432/seckill?sslmode=require"
        );
        assert_eq!(
            redacted("rediss://:tok@clustercfg:6379"),
            "rediss://:***@clustercfg:6379"
        );
        assert_eq!(
            redacted("postgres://u@h/db?password=hunter2&sslmode=require"),
            "postgres://u@h/db?password=***&sslmode=require"
        );
        assert_eq!(redacted("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
        assert_eq!(redacted("not a url hunter2"), "***");
    }
}
