//! How each setting's text is read: every parser refuses a malformed or blank value with a
//! message, never a silent default.

use crate::infra::secret::SecretUrl;
use std::time::Duration;

/// Any text but a blank one: a variable set to nothing is a mistake, not a default.
pub fn non_blank(value: &str) -> Result<String, String> {
    if value.trim().is_empty() {
        Err("must not be blank".into())
    } else {
        Ok(value.to_string())
    }
}

/// One item of a comma-separated list (`a, b`), trimmed.
pub(super) fn trimmed(value: &str) -> Result<String, String> {
    Ok(value.trim().to_string())
}

/// [`non_blank`] as a [`SecretUrl`], but the empty string stands for "not given" (the default
/// of a setting that another one may supply); [`Config::check`] refuses it when nothing else
/// did.
pub(super) fn empty_or_non_blank_url(value: &str) -> Result<SecretUrl, String> {
    if value.is_empty() {
        Ok(SecretUrl::default())
    } else {
        non_blank(value).map(SecretUrl::from)
    }
}

pub(super) fn whole<T: std::str::FromStr>(value: &str) -> Result<T, String> {
    value
        .trim()
        .parse()
        .map_err(|_| "must be a non-negative whole number".into())
}

/// A whole number, 1 or more.
pub(super) fn at_least_one(value: &str) -> Result<i64, String> {
    match whole::<u32>(value)? {
        0 => Err("must be at least 1".into()),
        n => Ok(i64::from(n)),
    }
}

/// A whole number of milliseconds.
pub fn millis(value: &str) -> Result<Duration, String> {
    whole(value).map(Duration::from_millis)
}

/// The longest [`Config::public_view_cache_ttl`](super::Config::public_view_cache_ttl): the
/// view's stock may lag Redis by this.
pub const MAX_PUBLIC_VIEW_CACHE: Duration = Duration::from_millis(250);

/// [`millis`], at most [`MAX_PUBLIC_VIEW_CACHE`]: a longer value is refused, not clamped.
pub(super) fn view_cache_millis(value: &str) -> Result<Duration, String> {
    let ttl = millis(value)?;
    if ttl > MAX_PUBLIC_VIEW_CACHE {
        return Err(format!(
            "must be at most {} ms",
            MAX_PUBLIC_VIEW_CACHE.as_millis()
        ));
    }
    Ok(ttl)
}

/// The window [`Config::user_db_rate_per_sec`](super::Config::user_db_rate_per_sec) is counted
/// over: two seconds, so a page that asks for its order, pays and asks again at once is not
/// refused, while one user's loop is held to the rate on average.
pub const USER_DB_RATE_WINDOW: Duration = Duration::from_secs(2);

/// The most [`Config::user_db_rate_per_sec`] takes: above it the limit would bound nothing a
/// container's connections could serve.
pub(super) const MAX_USER_DB_RATE: u32 = 1000;

/// A whole number up to [`MAX_USER_DB_RATE`]; a larger one is refused, not clamped.
pub(super) fn user_db_rate(value: &str) -> Result<u32, String> {
    let rate = whole::<u32>(value)?;
    if rate > MAX_USER_DB_RATE {
        return Err(format!("must be at most {MAX_USER_DB_RATE}"));
    }
    Ok(rate)
}

pub(super) fn secs(value: &str) -> Result<Duration, String> {
    whole(value).map(Duration::from_secs)
}

/// A whole number of milliseconds, at least 1.
pub(super) fn positive_millis(value: &str) -> Result<Duration, String> {
    at_least_one(value).map(|n| Duration::from_millis(n.unsigned_abs()))
}
