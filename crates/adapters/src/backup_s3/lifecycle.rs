//! The bucket's lifecycle rules, as far as they bear on when an artifact is gone.
//!
//! Only enabled rules with an `Expiration` count (`Days`, or a `Date`); transitions, noncurrent
//! versions and delete markers do not end an object's current version. A rule applies to a key
//! under its prefix (`Filter/Prefix`, `Filter/And/Prefix`, or the older `Rule/Prefix`; none: the
//! whole bucket). A rule that also filters by tags or size may or may not apply to an object
//! (Lethe reads no object's tags): such a rule is *possible*, one without those filters *sure*.
//!
//! When does the bucket delete an object? At the earliest expiration of the rules that apply
//! to it. So the latest that can be is the earliest of the sure rules, if there is one;
//! otherwise, when possible rules exist, the latest of them (or never, if none applies: then
//! the target's `retention_days` governs alone). [`Rules::expires`] gives that day, which the
//! adapter then takes only when it is later than `retention_days` gives: Lethe never
//! promises an earlier date than reality.

use time::{Date, OffsetDateTime};

use super::xml::Element;

/// One expiration rule.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Rule {
    prefix: String,
    /// Filters by tags or size too: may not apply to a given object.
    conditional: bool,
    expiry: Expiry,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expiry {
    /// `Days` after the object's creation, rounded up to the next midnight UTC (as S3 does).
    Days(u32),
    /// On that day (midnight UTC), for objects created before it.
    Date(Date),
}

/// A bucket's expiration rules.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Rules(Vec<Rule>);

impl Rules {
    /// Reads a `LifecycleConfiguration` document's expiration rules.
    pub(crate) fn parse(root: &Element) -> Result<Self, String> {
        if root.name != "LifecycleConfiguration" {
            return Err(format!("a <{}> where a LifecycleConfiguration was expected", root.name));
        }
        let mut rules = Vec::new();
        for r in root.all("Rule") {
            if r.text_of("Status").map(str::trim) != Some("Enabled") {
                continue;
            }
            let Some(exp) = r.child("Expiration") else {
                continue;
            };
            let expiry = if let Some(d) = exp.text_of("Days") {
                let d: u32 = d
                    .trim()
                    .parse()
                    .map_err(|_| "a lifecycle rule's Expiration/Days is not a whole number")?;
                Expiry::Days(d)
            } else if let Some(d) = exp.text_of("Date") {
                let d = OffsetDateTime::parse(d.trim(), &time::format_description::well_known::Rfc3339)
                    .map_err(|_| "a lifecycle rule's Expiration/Date is not an ISO 8601 date")?;
                Expiry::Date(d.to_offset(time::UtcOffset::UTC).date())
            } else {
                // ExpiredObjectDeleteMarker only: nothing current expires.
                continue;
            };
            let (prefix, conditional) = match r.child("Filter") {
                Some(f) => match f.child("And") {
                    Some(and) => (
                        and.text_of("Prefix").unwrap_or_default(),
                        and.children.iter().any(|c| c.name != "Prefix"),
                    ),
                    None => (
                        f.text_of("Prefix").unwrap_or_default(),
                        f.children.iter().any(|c| c.name != "Prefix"),
                    ),
                },
                None => (r.text_of("Prefix").unwrap_or_default(), false),
            };
            rules.push(Rule {
                prefix: prefix.to_string(),
                conditional,
                expiry,
            });
        }
        Ok(Self(rules))
    }

    /// The latest day the bucket's rules can let the object `key`, created at `taken`, live
    /// to; `None`: no rule applies for sure or possibly.
    pub(crate) fn expires(&self, key: &str, taken: OffsetDateTime) -> Option<Date> {
        let taken = taken.to_offset(time::UtcOffset::UTC);
        let day = |e: Expiry| match e {
            Expiry::Days(d) => {
                let at = taken + time::Duration::days(i64::from(d));
                // The next midnight UTC at or after creation plus the days.
                if at.time() == time::Time::MIDNIGHT {
                    Some(at.date())
                } else {
                    at.date().next_day()
                }
            }
            Expiry::Date(d) if taken.date() < d => Some(d),
            // Created on or after the rule's date: the rule expired what existed then.
            Expiry::Date(_) => None,
        };
        let applying = self.0.iter().filter(|r| key.starts_with(&r.prefix));
        let (sure, possible): (Vec<&Rule>, Vec<&Rule>) = applying.partition(|r| !r.conditional);
        if !sure.is_empty() {
            // Dated rules that no longer expire this object are not sure to delete it.
            let days: Vec<Date> = sure.iter().filter_map(|r| day(r.expiry)).collect();
            if let Some(first) = days.iter().min() {
                return Some(*first);
            }
        }
        possible.iter().filter_map(|r| day(r.expiry)).max()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::{date, datetime};

    fn rules(xml: &str) -> Rules {
        Rules::parse(&super::super::xml::parse(xml.as_bytes()).unwrap()).unwrap()
    }

    const DOC: &str = r#"<LifecycleConfiguration xmlns="http://s3.amazonaws.com/doc/2006-03-01/">
      <Rule><ID>all-nightly</ID><Filter><Prefix>nightly/</Prefix></Filter><Status>Enabled</Status>
        <Expiration><Days>60</Days></Expiration></Rule>
      <Rule><ID>off</ID><Filter><Prefix>nightly/</Prefix></Filter><Status>Disabled</Status>
        <Expiration><Days>1</Days></Expiration></Rule>
      <Rule><ID>tagged</ID><Filter><And><Prefix>nightly/</Prefix><Tag><Key>k</Key><Value>v</Value></Tag></And></Filter>
        <Status>Enabled</Status><Expiration><Days>400</Days></Expiration></Rule>
      <Rule><ID>legacy</ID><Prefix>weekly/</Prefix><Status>Enabled</Status>
        <Expiration><Days>90</Days></Expiration></Rule>
      <Rule><ID>big</ID><Filter><ObjectSizeGreaterThan>10</ObjectSizeGreaterThan></Filter><Status>Enabled</Status>
        <Expiration><Days>200</Days></Expiration></Rule>
      <Rule><ID>markers</ID><Filter></Filter><Status>Enabled</Status>
        <Expiration><ExpiredObjectDeleteMarker>true</ExpiredObjectDeleteMarker></Expiration></Rule>
      <Rule><ID>moves</ID><Filter/><Status>Enabled</Status>
        <Transition><Days>1</Days><StorageClass>GLACIER</StorageClass></Transition></Rule>
    </LifecycleConfiguration>"#;

    #[test]
    fn the_earliest_sure_rule_bounds_an_object_and_possible_rules_only_without_one() {
        let r = rules(DOC);
        let taken = datetime!(2026-12-01 10:00 UTC);
        // Sure: 60 days (the disabled 1-day rule does not count); the tagged 400-day rule and
        // the 200-day size rule could only make it earlier.
        assert_eq!(r.expires("nightly/a.dump", taken), Some(date!(2027 - 01 - 31)));
        // The older form of prefix.
        assert_eq!(r.expires("weekly/a.dump", taken), Some(date!(2027 - 03 - 02)));
        // Only the size rule may apply: its day is the latest the bucket could keep it.
        assert_eq!(r.expires("other/a.dump", taken), Some(date!(2027 - 06 - 20)));
        // Exactly midnight is not rounded up.
        assert_eq!(
            r.expires("nightly/a.dump", datetime!(2026-12-01 00:00 UTC)),
            Some(date!(2027 - 01 - 30))
        );
        assert_eq!(rules("<LifecycleConfiguration/>").expires("a", taken), None);
    }

    #[test]
    fn a_dated_rule_expires_what_was_created_before_its_date() {
        let r = rules(
            "<LifecycleConfiguration><Rule><Filter><Prefix></Prefix></Filter><Status>Enabled</Status>\
             <Expiration><Date>2027-01-01T00:00:00.000Z</Date></Expiration></Rule></LifecycleConfiguration>",
        );
        assert_eq!(
            r.expires("a", datetime!(2026-12-01 10:00 UTC)),
            Some(date!(2027 - 01 - 01))
        );
        assert_eq!(r.expires("a", datetime!(2027-01-02 10:00 UTC)), None);
    }

    #[test]
    fn malformed_rules_are_refused() {
        for bad in [
            "<Error/>",
            "<LifecycleConfiguration><Rule><Status>Enabled</Status><Expiration><Days>x</Days></Expiration></Rule></LifecycleConfiguration>",
            "<LifecycleConfiguration><Rule><Status>Enabled</Status><Expiration><Date>soon</Date></Expiration></Rule></LifecycleConfiguration>",
        ] {
            let root = super::super::xml::parse(bad.as_bytes()).unwrap();
            assert!(Rules::parse(&root).is_err(), "{bad}");
        }
    }
}
