//! Identifiers: stable ids of a tenant, a subject, a memory and a memory's version.
//!
//! An identifier is non-empty UTF-8 of at most [`MAX_LEN`] bytes with no control characters.
//! That is all this module checks: whether a given store can express an identifier (a separator
//! inside it, say) is each adapter's question. Error messages name the flag and the rule broken,
//! never the identifier itself, because identifiers are personal data.

use std::fmt;

/// The longest identifier, in bytes of UTF-8.
pub const MAX_LEN: usize = 256;

/// Why an identifier was refused. Never carries the identifier.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentError {
    /// The identifier was the empty string.
    #[error("{field} is empty")]
    Empty {
        /// Which identifier (`tenant`, `subject`, ...).
        field: &'static str,
    },
    /// The identifier was longer than [`MAX_LEN`] bytes.
    #[error("{field} is {len} bytes long; the limit is {MAX_LEN} bytes of UTF-8")]
    TooLong {
        /// Which identifier.
        field: &'static str,
        /// Its length in bytes.
        len: usize,
    },
    /// The identifier held a control character (U+0000-U+001F, U+007F-U+009F).
    #[error("{field} contains a control character at byte {at}")]
    Control {
        /// Which identifier.
        field: &'static str,
        /// Byte offset of the control character.
        at: usize,
    },
}

/// A character that prints as nothing (or as a blank) and makes one name look like another:
/// format characters (zero-width, bidirectional marks and overrides), variation selectors,
/// fillers and tags. Not a full Unicode category table; the ones seen in look-alike names.
pub fn is_invisible(c: char) -> bool {
    matches!(c,
        '\u{00AD}' | '\u{034F}' | '\u{061C}' | '\u{115F}' | '\u{1160}' | '\u{17B4}' | '\u{17B5}'
        | '\u{180B}'..='\u{180F}' | '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}'
        | '\u{2060}'..='\u{206F}' | '\u{2800}' | '\u{3164}' | '\u{FE00}'..='\u{FE0F}'
        | '\u{FEFF}' | '\u{FFA0}' | '\u{1D173}'..='\u{1D17A}' | '\u{E0000}'..='\u{E0FFF}')
}

fn check(field: &'static str, s: &str) -> Result<(), IdentError> {
    if s.is_empty() {
        return Err(IdentError::Empty { field });
    }
    if s.len() > MAX_LEN {
        return Err(IdentError::TooLong {
            field,
            len: s.len(),
        });
    }
    if let Some((at, _)) = s.char_indices().find(|(_, c)| c.is_control()) {
        return Err(IdentError::Control { field, at });
    }
    Ok(())
}

macro_rules! identifier {
    ($(#[$doc:meta])* $name:ident, $field:literal) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            /// Validates `s` as this kind of identifier.
            pub fn new(s: impl Into<String>) -> Result<Self, IdentError> {
                let s = s.into();
                check($field, &s)?;
                Ok(Self(s))
            }

            /// The identifier's text. Personal data: never log it.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl TryFrom<String> for $name {
            type Error = IdentError;
            fn try_from(s: String) -> Result<Self, IdentError> {
                Self::new(s)
            }
        }

        impl From<$name> for String {
            fn from(v: $name) -> String {
                v.0
            }
        }

        /// Redacted: an identifier must not reach a log line through `{:?}`.
        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!(stringify!($name), "(<redacted>)"))
            }
        }
    };
}

identifier!(
    /// A customer organisation's stable id.
    Tenant,
    "tenant"
);
identifier!(
    /// A person's stable id within a tenant. Never a name or an e-mail matched fuzzily.
    Subject,
    "subject"
);
identifier!(
    /// One memory's id within a subject, as a target's layout defines it
    /// (for a LangGraph store: the namespace suffix and the key, `memories/k42`).
    MemoryId,
    "memory"
);
identifier!(
    /// One version of a memory (for a LangGraph store: the item's `updated_at`).
    Version,
    "version"
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_awkward_but_valid_identifiers() {
        for s in [
            "%",
            "_",
            "*",
            "?",
            "[",
            "'",
            ":",
            "/",
            "a b",
            "zoë",
            "用户",
            &"x".repeat(256),
        ] {
            assert!(
                Subject::new(s).is_ok(),
                "refused a valid identifier of {} bytes",
                s.len()
            );
        }
    }

    #[test]
    fn refuses_empty_long_and_control() {
        assert_eq!(
            Subject::new(""),
            Err(IdentError::Empty { field: "subject" })
        );
        assert_eq!(
            Tenant::new("x".repeat(257)),
            Err(IdentError::TooLong {
                field: "tenant",
                len: 257
            })
        );
        // 255 bytes of ASCII plus a two-byte character is 257 bytes: counted in bytes, not chars.
        assert!(Tenant::new(format!("{}ë", "x".repeat(255))).is_err());
        assert_eq!(
            Subject::new("a\nb"),
            Err(IdentError::Control {
                field: "subject",
                at: 1
            })
        );
        assert!(Subject::new("a\u{7f}").is_err());
        assert!(Subject::new("a\u{85}").is_err());
    }

    #[test]
    fn debug_never_shows_the_identifier() {
        let s = Subject::new("alice").unwrap();
        assert!(!format!("{s:?}").contains("alice"));
        let e = Subject::new("alice\u{1}").unwrap_err().to_string();
        assert!(!e.contains("alice"), "{e}");
    }
}
