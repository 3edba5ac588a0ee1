//! Legal bases for erasure and the deadlines they set.
//!
//! GDPR Art. 12(3): one month from receipt, extendable by two further months with a reason.
//! CCPA §1798.130: 45 days, extendable once by 45 days with notice. Account closure and tenant
//! offboarding follow the deployment's policy; Lethe defaults them to 30 days.

use std::fmt;
use std::str::FromStr;

use time::{Date, Duration, Month};

/// Why the data is erased.
#[derive(Clone, Copy, PartialEq, Eq, Debug, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Basis {
    /// GDPR Article 17, right to erasure.
    #[serde(rename = "gdpr-art17")]
    GdprArt17,
    /// California Consumer Privacy Act deletion request.
    Ccpa,
    /// The user closed their account.
    AccountClosure,
    /// The customer organisation left.
    TenantOffboarding,
}

/// A deadline that the basis does not allow.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
pub enum DeadlineError {
    /// Before the request was received.
    #[error("the deadline asked for is before the request date {received}")]
    BeforeReceipt {
        /// The deadline asked for.
        deadline: Date,
        /// The day the request was received.
        received: Date,
    },
    /// Past the longest extension the basis allows.
    #[error(
        "the deadline asked for is past {latest}, the latest {basis} allows even with an extension"
    )]
    PastLimit {
        /// The deadline asked for.
        deadline: Date,
        /// The latest allowed.
        latest: Date,
        /// The basis.
        basis: Basis,
    },
    /// Past the normal deadline without a recorded reason for the extension.
    #[error("the deadline asked for is past {normal}, {basis}'s normal deadline: give `extension_reason`")]
    ExtensionNeedsReason {
        /// The deadline asked for.
        deadline: Date,
        /// The normal deadline.
        normal: Date,
        /// The basis.
        basis: Basis,
    },
    /// A reason for an extension given with a deadline that extends nothing.
    #[error("the deadline asked for is within {normal}, {basis}'s normal deadline: it is not an extension, so drop `extension_reason`")]
    ReasonWithoutExtension {
        /// The deadline asked for.
        deadline: Date,
        /// The normal deadline.
        normal: Date,
        /// The basis.
        basis: Basis,
    },
}

impl Basis {
    /// Every basis, in the order `--help` lists them.
    pub const ALL: [Basis; 4] = [
        Basis::GdprArt17,
        Basis::Ccpa,
        Basis::AccountClosure,
        Basis::TenantOffboarding,
    ];

    /// The name used on the command line, in the journal and on certificates.
    pub fn as_str(self) -> &'static str {
        match self {
            Basis::GdprArt17 => "gdpr-art17",
            Basis::Ccpa => "ccpa",
            Basis::AccountClosure => "account-closure",
            Basis::TenantOffboarding => "tenant-offboarding",
        }
    }

    /// The deadline without an extension, counted from the day of receipt.
    pub fn normal_deadline(self, received: Date) -> Date {
        match self {
            Basis::GdprArt17 => add_months(received, 1),
            Basis::Ccpa => received + Duration::days(45),
            Basis::AccountClosure | Basis::TenantOffboarding => received + Duration::days(30),
        }
    }

    /// The latest deadline an extension can reach.
    pub fn latest_deadline(self, received: Date) -> Date {
        match self {
            Basis::GdprArt17 => add_months(received, 3),
            Basis::Ccpa => received + Duration::days(90),
            Basis::AccountClosure | Basis::TenantOffboarding => received + Duration::days(30),
        }
    }

    /// Checks an explicit deadline, or computes the normal one.
    pub fn deadline(
        self,
        received: Date,
        asked: Option<Date>,
        has_extension_reason: bool,
    ) -> Result<Date, DeadlineError> {
        let Some(deadline) = asked else {
            return Ok(self.normal_deadline(received));
        };
        if deadline < received {
            return Err(DeadlineError::BeforeReceipt { deadline, received });
        }
        let latest = self.latest_deadline(received);
        if deadline > latest {
            return Err(DeadlineError::PastLimit {
                deadline,
                latest,
                basis: self,
            });
        }
        let normal = self.normal_deadline(received);
        if deadline > normal && !has_extension_reason {
            return Err(DeadlineError::ExtensionNeedsReason {
                deadline,
                normal,
                basis: self,
            });
        }
        if deadline <= normal && has_extension_reason {
            return Err(DeadlineError::ReasonWithoutExtension {
                deadline,
                normal,
                basis: self,
            });
        }
        Ok(deadline)
    }
}

/// Calendar months, clamped to the last day of a shorter month (31 Jan + 1 month = 28/29 Feb).
fn add_months(d: Date, months: u8) -> Date {
    let total = d.month() as i32 - 1 + months as i32;
    let year = d.year() + total / 12;
    let month = Month::try_from((total % 12 + 1) as u8).expect("1..=12");
    let last = month.length(year);
    Date::from_calendar_date(year, month, d.day().min(last)).expect("day clamped to the month")
}

impl fmt::Display for Basis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Basis {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|b| b.as_str() == s)
            .ok_or_else(|| {
                let known: Vec<_> = Self::ALL.iter().map(|b| b.as_str()).collect();
                format!(
                    "unknown basis (not repeated here); known: {}",
                    known.join(", ")
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::date;

    #[test]
    fn gdpr_is_one_calendar_month_clamped() {
        assert_eq!(
            Basis::GdprArt17.normal_deadline(date!(2026 - 12 - 02)),
            date!(2027 - 01 - 02)
        );
        assert_eq!(
            Basis::GdprArt17.normal_deadline(date!(2027 - 01 - 31)),
            date!(2027 - 02 - 28)
        );
        assert_eq!(
            Basis::GdprArt17.latest_deadline(date!(2026 - 11 - 30)),
            date!(2027 - 02 - 28)
        );
    }

    #[test]
    fn ccpa_is_45_plus_45_days() {
        let r = date!(2026 - 12 - 02);
        assert_eq!(Basis::Ccpa.normal_deadline(r), date!(2027 - 01 - 16));
        assert_eq!(Basis::Ccpa.latest_deadline(r), date!(2027 - 03 - 02));
    }

    #[test]
    fn extensions_need_a_reason_and_a_limit() {
        let r = date!(2026 - 12 - 02);
        let b = Basis::GdprArt17;
        assert_eq!(b.deadline(r, None, false), Ok(date!(2027 - 01 - 02)));
        assert_eq!(
            b.deadline(r, Some(date!(2026 - 12 - 20)), false),
            Ok(date!(2026 - 12 - 20))
        );
        assert!(matches!(
            b.deadline(r, Some(date!(2027 - 02 - 01)), false),
            Err(DeadlineError::ExtensionNeedsReason { .. })
        ));
        assert_eq!(
            b.deadline(r, Some(date!(2027 - 02 - 01)), true),
            Ok(date!(2027 - 02 - 01))
        );
        assert!(matches!(
            b.deadline(r, Some(date!(2027 - 03 - 03)), true),
            Err(DeadlineError::PastLimit { .. })
        ));
        assert!(matches!(
            b.deadline(r, Some(date!(2026 - 12 - 01)), true),
            Err(DeadlineError::BeforeReceipt { .. })
        ));
        // A reason with a deadline that extends nothing would be journaled for nothing.
        for d in [date!(2026 - 12 - 20), date!(2027 - 01 - 02)] {
            assert!(matches!(
                b.deadline(r, Some(d), true),
                Err(DeadlineError::ReasonWithoutExtension { .. })
            ));
        }
    }

    #[test]
    fn parses_every_name_and_names_the_known_ones() {
        for b in Basis::ALL {
            assert_eq!(b.as_str().parse::<Basis>(), Ok(b));
        }
        let e = "gdpr".parse::<Basis>().unwrap_err();
        assert!(
            e.contains("gdpr-art17") && e.contains("tenant-offboarding"),
            "{e}"
        );
    }
}
