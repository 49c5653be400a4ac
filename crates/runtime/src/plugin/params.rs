//! User parameters (`--set schedule.warmup_epochs=5`) checked against what the plugin declares
//! in `describe()`. The host parses and type-checks, so every plugin, in any language, gets the
//! same error messages for typos and malformed numbers, and `configure` only ever sees
//! well-typed values for every declared parameter.

use lsgd_policy::{ParamSpec, ParamType, Params, Value};

use crate::{Error, Result};

/// Resolves raw `KEY=VALUE` settings into a full, typed parameter list in declaration order.
/// The host parses each value by its declared type; defaults, order and required parameters
/// are `lsgd_policy::Params::resolve`'s, the same rules a guest applies.
pub fn resolve(specs: &[ParamSpec], settings: &[(String, String)]) -> Result<Vec<(String, Value)>> {
    resolve_text(specs, settings).map_err(Error::Param)
}

fn resolve_text(
    specs: &[ParamSpec],
    settings: &[(String, String)],
) -> Result<Vec<(String, Value)>, String> {
    let given = settings
        .iter()
        .map(|(key, raw)| {
            let spec = specs.iter().find(|s| s.name == *key).ok_or_else(|| {
                let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
                if names.is_empty() {
                    format!("unknown parameter `{key}`: this plugin takes no parameters")
                } else {
                    format!(
                        "unknown parameter `{key}`; it accepts: {}",
                        names.join(", ")
                    )
                }
            })?;
            Ok((key.clone(), parse(spec, raw)?))
        })
        .collect::<Result<Vec<_>, String>>()?;
    // Later settings overlay earlier ones, as with repeated command-line flags.
    Params::resolve(specs, given).map(|p| p.0)
}

/// Checks that a plugin's declared defaults have the types it declared.
pub fn check_specs(specs: &[ParamSpec]) -> Result<()> {
    for (i, spec) in specs.iter().enumerate() {
        if specs[..i].iter().any(|s| s.name == spec.name) {
            return Err(Error::Param(format!(
                "declares parameter `{}` twice",
                spec.name
            )));
        }
        if let Some(default) = &spec.default
            && !matches(&spec.ty, default)
        {
            return Err(Error::Param(format!(
                "parameter `{}` is declared {} but its default is {}",
                spec.name,
                type_name(&spec.ty),
                render(default)
            )));
        }
    }
    Ok(())
}

fn matches(ty: &ParamType, v: &Value) -> bool {
    match (ty, v) {
        (ParamType::Boolean, Value::Boolean(_))
        | (ParamType::Integer, Value::Integer(_))
        | (ParamType::Float, Value::Float(_))
        | (ParamType::Text, Value::Text(_))
        | (ParamType::FloatList, Value::FloatList(_)) => true,
        (ParamType::Choice(c), Value::Text(t)) => c.contains(t),
        _ => false,
    }
}

fn parse(spec: &ParamSpec, raw: &str) -> Result<Value, String> {
    let raw = raw.trim();
    let bad = |what: &str| format!("parameter `{}` expects {what}, got `{raw}`", spec.name);
    Ok(match &spec.ty {
        ParamType::Boolean => match raw.to_ascii_lowercase().as_str() {
            "true" | "yes" | "on" | "1" => Value::Boolean(true),
            "false" | "no" | "off" | "0" => Value::Boolean(false),
            _ => return Err(bad("true or false")),
        },
        ParamType::Integer => Value::Integer(raw.parse().map_err(|_| bad("an integer"))?),
        ParamType::Float => Value::Float(parse_float(raw).ok_or_else(|| bad("a finite number"))?),
        ParamType::Text => Value::Text(raw.to_string()),
        ParamType::FloatList => Value::FloatList(if raw.is_empty() {
            Vec::new()
        } else {
            raw.split(',')
                .map(|p| parse_float(p.trim()))
                .collect::<Option<_>>()
                .ok_or_else(|| bad("comma-separated finite numbers, e.g. 30,60,80"))?
        }),
        ParamType::Choice(choices) => {
            if !choices.iter().any(|c| c == raw) {
                return Err(bad(&format!("one of {}", choices.join(", "))));
            }
            Value::Text(raw.to_string())
        }
    })
}

fn parse_float(s: &str) -> Option<f64> {
    s.parse::<f64>().ok().filter(|f| f.is_finite())
}

/// A parameter type as `inspect` prints it.
pub fn type_name(ty: &ParamType) -> String {
    match ty {
        ParamType::Boolean => "bool".into(),
        ParamType::Integer => "int".into(),
        ParamType::Float => "float".into(),
        ParamType::Text => "text".into(),
        ParamType::FloatList => "float-list".into(),
        ParamType::Choice(c) => c.join("|"),
    }
}

/// A value as the user would type it on the command line.
pub fn render(v: &Value) -> String {
    match v {
        Value::Boolean(b) => b.to_string(),
        Value::Integer(i) => i.to_string(),
        Value::Float(f) => f.to_string(),
        Value::Text(t) => t.clone(),
        Value::FloatList(l) => l.iter().map(f64::to_string).collect::<Vec<_>>().join(","),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn specs() -> Vec<ParamSpec> {
        vec![
            ParamSpec {
                name: "warmup_epochs".into(),
                ty: ParamType::Float,
                default: Some(Value::Float(5.0)),
                doc: "epochs".into(),
            },
            ParamSpec {
                name: "milestones".into(),
                ty: ParamType::FloatList,
                default: Some(Value::FloatList(vec![30.0])),
                doc: "epochs".into(),
            },
            ParamSpec {
                name: "warmup".into(),
                ty: ParamType::Choice(vec!["gradual".into(), "none".into()]),
                default: Some(Value::Text("gradual".into())),
                doc: "kind".into(),
            },
            ParamSpec {
                name: "seed".into(),
                ty: ParamType::Integer,
                default: None,
                doc: "required seed".into(),
            },
        ]
    }

    fn set(kv: &[(&str, &str)]) -> Vec<(String, String)> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn fills_defaults_in_declaration_order_and_last_setting_wins() {
        let got = resolve(
            &specs(),
            &set(&[("seed", "1"), ("milestones", "10, 20"), ("seed", "7")]),
        )
        .unwrap();
        assert_eq!(
            got,
            vec![
                ("warmup_epochs".into(), Value::Float(5.0)),
                ("milestones".into(), Value::FloatList(vec![10.0, 20.0])),
                ("warmup".into(), Value::Text("gradual".into())),
                ("seed".into(), Value::Integer(7)),
            ]
        );
    }

    #[test]
    fn errors_name_the_parameter_and_what_it_expects() {
        let err = |kv: &[(&str, &str)]| resolve(&specs(), &set(kv)).unwrap_err().to_string();
        let e = err(&[("warmup_epoch", "5")]);
        assert!(
            e.contains("unknown parameter `warmup_epoch`")
                && e.contains("warmup_epochs, milestones"),
            "{e}"
        );
        let e = err(&[("seed", "1"), ("warmup_epochs", "five")]);
        assert!(
            e.contains("`warmup_epochs` expects a finite number, got `five`"),
            "{e}"
        );
        let e = err(&[("seed", "1"), ("warmup_epochs", "inf")]);
        assert!(e.contains("finite"), "{e}");
        let e = err(&[("seed", "1"), ("warmup", "linear")]);
        assert!(e.contains("one of gradual, none"), "{e}");
        let e = err(&[]);
        assert!(e.contains("missing required parameter 'seed'"), "{e}");
        let e = err(&[("seed", "1"), ("milestones", "30,x")]);
        assert!(e.contains("comma-separated"), "{e}");
    }

    #[test]
    fn declared_defaults_must_match_their_types() {
        let mut s = specs();
        s[0].default = Some(Value::Text("5".into()));
        assert!(
            check_specs(&s)
                .unwrap_err()
                .to_string()
                .contains("declared float but its default is 5")
        );
        let mut s = specs();
        s.push(s[0].clone());
        assert!(check_specs(&s).unwrap_err().to_string().contains("twice"));
        assert!(check_specs(&specs()).is_ok());
    }
}
