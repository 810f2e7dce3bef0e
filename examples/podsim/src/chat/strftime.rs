//! `strftime_now(format)`, the function transformers gives chat templates (Llama 3.2 and later
//! print today's date with it): the current UTC time through a subset of C's `strftime`.

use std::time::{SystemTime, UNIX_EPOCH};

use minijinja::{Error, ErrorKind};

const DAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];
const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// The template function: now, formatted.
pub fn strftime_now(format: &str) -> Result<String, Error> {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    format_utc(secs, format)
}

/// `unix_seconds` (UTC) formatted with `%a %A %b %B %d %e %H %I %j %m %M %p %S %y %Y %%`.
pub fn format_utc(unix_seconds: u64, format: &str) -> Result<String, Error> {
    let days = unix_seconds / 86_400;
    let secs = unix_seconds % 86_400;
    let (year, month, day) = civil_from_days(days);
    let weekday = ((days + 3) % 7) as usize; // 1970-01-01 was a Thursday (index 3)
    let day_of_year = days - days_from_civil(year, 1, 1) + 1;
    let (hour, minute, second) = (secs / 3600, secs / 60 % 60, secs % 60);
    let month_name = MONTHS.get(month as usize - 1).copied().unwrap_or("");
    let day_name = DAYS.get(weekday).copied().unwrap_or("");
    let mut out = String::with_capacity(format.len() + 16);
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('a') => out.push_str(day_name.get(..3).unwrap_or(day_name)),
            Some('A') => out.push_str(day_name),
            Some('b') => out.push_str(month_name.get(..3).unwrap_or(month_name)),
            Some('B') => out.push_str(month_name),
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('e') => out.push_str(&format!("{day:>2}")),
            Some('H') => out.push_str(&format!("{hour:02}")),
            Some('I') => out.push_str(&format!("{:02}", (hour + 11) % 12 + 1)),
            Some('j') => out.push_str(&format!("{day_of_year:03}")),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('M') => out.push_str(&format!("{minute:02}")),
            Some('p') => out.push_str(if hour < 12 { "AM" } else { "PM" }),
            Some('S') => out.push_str(&format!("{second:02}")),
            Some('y') => out.push_str(&format!("{:02}", year % 100)),
            Some('Y') => out.push_str(&year.to_string()),
            Some('%') => out.push('%'),
            other => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!(
                        "strftime_now: unsupported directive %{}",
                        other.map_or(String::new(), String::from)
                    ),
                ))
            }
        }
    }
    Ok(out)
}

/// (year, month 1-12, day 1-31) of a day count since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

/// Days since 1970-01-01 of a date from 1970 on.
fn days_from_civil(year: u64, month: u64, day: u64) -> u64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y / 400;
    let yoe = y - era * 400;
    let mp = if month > 2 { month - 3 } else { month + 9 };
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    (era * 146_097 + doe).saturating_sub(719_468)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_format_like_python_strftime() {
        // 2024-07-26 13:05:09 UTC, a Friday, day 208 of a leap year.
        let t = 1_722_000_000 - 1_722_000_000 % 86_400 + 13 * 3600 + 5 * 60 + 9;
        assert_eq!(format_utc(t, "%d %b %Y").unwrap(), "26 Jul 2024");
        assert_eq!(
            format_utc(t, "%A %B %e, %y %H:%M:%S %I%p %j %%").unwrap(),
            "Friday July 26, 24 13:05:09 01PM 208 %"
        );
        assert_eq!(format_utc(0, "%Y-%m-%d %a").unwrap(), "1970-01-01 Thu");
        assert!(format_utc(0, "%Q").is_err());
    }
}
