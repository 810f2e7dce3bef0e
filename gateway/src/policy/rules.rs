//! The range rules the policies' `validate()` share: every problem reads `field: value: rule`,
//! the field name preceded by the TOML section's prefix (e.g. `hotness.`).

use std::fmt::Display;

/// Problems found so far in one configuration section.
pub(crate) struct Problems<'a> {
    prefix: &'a str,
    list: Vec<String>,
}

impl<'a> Problems<'a> {
    pub(crate) fn new(prefix: &'a str) -> Self {
        Self {
            prefix,
            list: Vec::new(),
        }
    }

    /// Records `name: value: rule` unless `ok`.
    pub(crate) fn check(&mut self, ok: bool, name: &str, value: impl Display, rule: impl Display) {
        if !ok {
            self.list
                .push(format!("{}{name}: {value}: {rule}", self.prefix));
        }
    }

    /// `value` must lie in `min..=max` (NaN never does).
    pub(crate) fn between<T: PartialOrd + Display>(
        &mut self,
        name: &str,
        value: T,
        min: T,
        max: T,
    ) {
        let ok = value >= min && value <= max;
        self.check(
            ok,
            name,
            &value,
            format_args!("must be between {min} and {max}"),
        );
    }

    /// `value` must lie in (0, 1].
    pub(crate) fn fraction(&mut self, name: &str, value: f64) {
        self.check(
            value > 0.0 && value <= 1.0,
            name,
            value,
            "must be in (0, 1]",
        );
    }

    /// `value` must be a finite number above 0.
    pub(crate) fn positive(&mut self, name: &str, value: f64) {
        let ok = value > 0.0 && value.is_finite();
        self.check(ok, name, value, "must be a positive number");
    }

    pub(crate) fn into_vec(self) -> Vec<String> {
        self.list
    }
}
