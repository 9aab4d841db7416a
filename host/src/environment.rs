//! Settings the environment overrides: one rule for every override.

/// An environment variable that overrides a setting: set and not empty. One
/// rule for every override (an empty variable is as good as unset), so
/// `FOO= hourglass serve` never swaps a configured value for nothing.
pub fn environment(variable: &str) -> Option<std::ffi::OsString> {
    std::env::var_os(variable).filter(|value| !value.is_empty())
}

/// [`environment`] as text (a value that is not UTF-8 is no URL or token).
pub fn environment_text(variable: &str) -> Option<String> {
    environment(variable).and_then(|value| value.into_string().ok())
}
