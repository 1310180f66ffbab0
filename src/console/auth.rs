//! Signed-in console sessions: kept server-side, bounded in number and in
//! life, named by a random cookie; each holds the principal the bearer
//! token stood for at sign-in (the token itself is not kept) and the CSRF
//! token its forms carry.
//!
//! The map is keyed by the SHA-256 of the cookie value, so a memory dump of
//! the map alone does not yield a usable cookie. Sign-in makes a new ID
//! (no fixation); sign-out, expiry and an idle timeout remove the entry, so
//! a replayed cookie finds nothing.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::auth::Principal;

/// The cookie's name.
pub const COOKIE: &str = "spillway_console";

/// Pre-sign-in entries (a sign-in form's CSRF token) kept at most; the
/// oldest goes when full.
const MAX_PENDING: usize = 1024;
/// How long a sign-in form stays valid.
const PENDING_LIFETIME: Duration = Duration::from_secs(15 * 60);

/// Who is signed in, and with what.
#[derive(Clone)]
pub struct Signed {
    /// The principal the token stands for.
    pub principal: Principal,
    /// The CSRF token of this session's forms.
    pub csrf: String,
    /// The cookie key (hashed), for sign-out.
    key: [u8; 32],
}

impl std::fmt::Debug for Signed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signed")
            .field("principal", &self.principal.id)
            .finish_non_exhaustive()
    }
}

impl Signed {
    /// Whether a submitted form's CSRF token is this session's.
    pub fn csrf_ok(&self, submitted: &str) -> bool {
        csrf_eq(&self.csrf, submitted)
    }
}

fn csrf_eq(want: &str, got: &str) -> bool {
    !want.is_empty() && bool::from(want.as_bytes().ct_eq(got.as_bytes()))
}

struct Entry {
    signed: Signed,
    created: Instant,
    last_seen: Instant,
}

struct Pending {
    csrf: String,
    created: Instant,
}

/// Why a cookie did not lead to a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Missing {
    /// No cookie at all.
    NoCookie,
    /// A cookie this console does not know: signed out, or never issued.
    Unknown,
    /// The session reached its lifetime or idle timeout.
    Expired,
}

/// Why a sign-in was refused before the token was even looked at.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignInError {
    /// The sign-in form's CSRF token is missing, stale or not this browser's.
    #[error(
        "the sign-in form has expired or was not issued to this browser; reload the sign-in page and try again"
    )]
    Form,
    #[error("the operating system's random source failed; try again")]
    /// The OS random source failed.
    Random,
    /// The store is full.
    #[error(
        "the console already has {0} signed-in sessions (console.max_sessions); sign out elsewhere, wait for idle sessions to time out, or raise the limit"
    )]
    Full(usize),
}

/// The session store.
pub struct Sessions {
    lifetime: Duration,
    idle: Duration,
    max: usize,
    active: Mutex<HashMap<[u8; 32], Entry>>,
    pending: Mutex<HashMap<[u8; 32], Pending>>,
}

impl std::fmt::Debug for Sessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sessions")
            .field("max", &self.max)
            .finish_non_exhaustive()
    }
}

/// 32 random bytes, hex.
pub fn random_token() -> Result<String, SignInError> {
    let mut b = [0u8; 32];
    getrandom::fill(&mut b).map_err(|_| SignInError::Random)?;
    Ok(hex::encode(b))
}

fn key_of(cookie: &str) -> [u8; 32] {
    Sha256::digest(cookie.as_bytes()).into()
}

impl Sessions {
    /// An empty store.
    pub fn new(lifetime: Duration, idle: Duration, max: usize) -> Self {
        Self {
            lifetime,
            idle,
            max,
            active: Mutex::default(),
            pending: Mutex::default(),
        }
    }

    /// The cookie's lifetime, for `Max-Age`.
    pub fn lifetime(&self) -> Duration {
        self.lifetime
    }

    fn active(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 32], Entry>> {
        self.active.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 32], Pending>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A sign-in form: returns the cookie value and the form's CSRF token.
    pub fn begin(&self) -> Result<(String, String), SignInError> {
        let (cookie, csrf) = (random_token()?, random_token()?);
        let now = Instant::now();
        let mut pending = self.pending();
        pending.retain(|_, p| now.duration_since(p.created) < PENDING_LIFETIME);
        if pending.len() >= MAX_PENDING
            && let Some(oldest) = pending
                .iter()
                .min_by_key(|(_, p)| p.created)
                .map(|(k, _)| *k)
        {
            pending.remove(&oldest);
        }
        pending.insert(
            key_of(&cookie),
            Pending {
                csrf: csrf.clone(),
                created: now,
            },
        );
        Ok((cookie, csrf))
    }

    /// Checks a sign-in form against the browser's pre-sign-in cookie and
    /// uses it up.
    pub fn take_form(&self, cookie: Option<&str>, csrf: &str) -> Result<(), SignInError> {
        let Some(cookie) = cookie else {
            return Err(SignInError::Form);
        };
        let p = self
            .pending()
            .remove(&key_of(cookie))
            .ok_or(SignInError::Form)?;
        if p.created.elapsed() >= PENDING_LIFETIME || !csrf_eq(&p.csrf, csrf) {
            return Err(SignInError::Form);
        }
        Ok(())
    }

    /// Signs `principal` in: returns the new session's cookie value.
    pub fn sign_in(&self, principal: Principal) -> Result<String, SignInError> {
        let (cookie, csrf) = (random_token()?, random_token()?);
        let key = key_of(&cookie);
        let now = Instant::now();
        let mut active = self.active();
        if active.len() >= self.max {
            active.retain(|_, e| self.live(e, now));
        }
        if active.len() >= self.max {
            return Err(SignInError::Full(self.max));
        }
        active.insert(
            key,
            Entry {
                signed: Signed {
                    principal,
                    csrf,
                    key,
                },
                created: now,
                last_seen: now,
            },
        );
        Ok(cookie)
    }

    fn live(&self, e: &Entry, now: Instant) -> bool {
        now.duration_since(e.created) < self.lifetime && now.duration_since(e.last_seen) < self.idle
    }

    /// The session a cookie names, touched; expired ones are removed.
    pub fn get(&self, cookie: Option<&str>) -> Result<Signed, Missing> {
        let Some(cookie) = cookie else {
            return Err(Missing::NoCookie);
        };
        let key = key_of(cookie);
        let now = Instant::now();
        let mut active = self.active();
        let Some(e) = active.get_mut(&key) else {
            return Err(Missing::Unknown);
        };
        if !self.live(e, now) {
            active.remove(&key);
            return Err(Missing::Expired);
        }
        e.last_seen = now;
        Ok(e.signed.clone())
    }

    /// Ends a session.
    pub fn sign_out(&self, s: &Signed) {
        self.active().remove(&s.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alice() -> Principal {
        Principal {
            id: "alice".into(),
            tenant: "acme".into(),
            roles: vec![crate::auth::Role::Compliance],
        }
    }

    #[test]
    fn a_signed_out_cookie_finds_nothing_when_replayed() {
        let s = Sessions::new(Duration::from_secs(60), Duration::from_secs(60), 4);
        let cookie = s.sign_in(alice()).unwrap();
        let signed = s.get(Some(&cookie)).unwrap();
        assert_eq!(signed.principal.id, "alice");
        s.sign_out(&signed);
        assert_eq!(s.get(Some(&cookie)).unwrap_err(), Missing::Unknown);
        assert_eq!(s.get(None).unwrap_err(), Missing::NoCookie);
    }

    #[test]
    fn a_session_past_its_lifetime_is_expired_and_removed() {
        let s = Sessions::new(Duration::from_millis(1), Duration::from_secs(60), 4);
        let cookie = s.sign_in(alice()).unwrap();
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(s.get(Some(&cookie)).unwrap_err(), Missing::Expired);
        assert_eq!(s.get(Some(&cookie)).unwrap_err(), Missing::Unknown);
    }

    #[test]
    fn the_store_is_bounded_and_refuses_sign_ins_when_full() {
        let s = Sessions::new(Duration::from_secs(60), Duration::from_secs(60), 2);
        s.sign_in(alice()).unwrap();
        s.sign_in(alice()).unwrap();
        let err = s.sign_in(alice()).unwrap_err();
        assert_eq!(err, SignInError::Full(2));
        assert!(err.to_string().contains("console.max_sessions"));
    }

    #[test]
    fn a_sign_in_form_is_good_once_and_only_with_its_cookie_and_token() {
        let s = Sessions::new(Duration::from_secs(60), Duration::from_secs(60), 2);
        let (cookie, csrf) = s.begin().unwrap();
        assert!(s.take_form(Some(&cookie), "wrong").is_err());
        let (cookie, csrf2) = s.begin().unwrap();
        assert!(s.take_form(None, &csrf2).is_err());
        let (cookie2, csrf3) = s.begin().unwrap();
        s.take_form(Some(&cookie2), &csrf3).unwrap();
        assert!(s.take_form(Some(&cookie2), &csrf3).is_err(), "used up");
        let _ = (cookie, csrf);
    }

    #[test]
    fn csrf_tokens_compare_exactly() {
        let s = Sessions::new(Duration::from_secs(60), Duration::from_secs(60), 2);
        let cookie = s.sign_in(alice()).unwrap();
        let signed = s.get(Some(&cookie)).unwrap();
        assert!(signed.csrf_ok(&signed.csrf.clone()));
        assert!(!signed.csrf_ok(""));
        assert!(!signed.csrf_ok(&signed.csrf[1..]));
    }
}
