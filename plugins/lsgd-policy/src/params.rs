//! Resolved parameter values and their typed getters.

use crate::{ParamSpec, ParamType, Value};

/// Named parameter values, in declaration order, as `configure` receives them.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Params(pub Vec<(String, Value)>);

impl Params {
    /// Every declared default, so a policy can be configured without any user input.
    pub fn defaults(specs: &[ParamSpec]) -> Params {
        Params(
            specs
                .iter()
                .filter_map(|s| Some((s.name.clone(), s.default.clone()?)))
                .collect(),
        )
    }

    /// Overlays `given` on the defaults of `specs`, rejecting unknown names, wrong types,
    /// words outside a choice and missing required values, so policies only check ranges.
    pub fn resolve(specs: &[ParamSpec], given: Vec<(String, Value)>) -> Result<Params, String> {
        let mut values: Vec<Option<Value>> = specs.iter().map(|s| s.default.clone()).collect();
        for (name, value) in given {
            let Some(i) = specs.iter().position(|s| s.name == name) else {
                let known: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
                return Err(format!(
                    "unknown parameter '{name}' (accepted: {})",
                    if known.is_empty() {
                        "none".to_owned()
                    } else {
                        known.join(", ")
                    }
                ));
            };
            check_type(&specs[i], &value)?;
            values[i] = Some(value);
        }
        specs
            .iter()
            .zip(values)
            .map(|(s, v)| match v {
                Some(v) => Ok((s.name.clone(), v)),
                None => Err(format!("missing required parameter '{}'", s.name)),
            })
            .collect::<Result<_, _>>()
            .map(Params)
    }

    /// The raw value, for policies that accept more than one type.
    pub fn get(&self, name: &str) -> Option<&Value> {
        self.0.iter().find(|(n, _)| n == name).map(|(_, v)| v)
    }

    /// A float parameter.
    pub fn float(&self, name: &str) -> Result<f64, String> {
        match self.typed(name)? {
            Value::Float(v) => Ok(*v),
            other => Err(wrong_type(name, "a float", other)),
        }
    }

    /// An integer parameter.
    pub fn integer(&self, name: &str) -> Result<i64, String> {
        match self.typed(name)? {
            Value::Integer(v) => Ok(*v),
            other => Err(wrong_type(name, "an integer", other)),
        }
    }

    /// A boolean parameter.
    pub fn boolean(&self, name: &str) -> Result<bool, String> {
        match self.typed(name)? {
            Value::Boolean(v) => Ok(*v),
            other => Err(wrong_type(name, "a boolean", other)),
        }
    }

    /// A text or choice parameter.
    pub fn text(&self, name: &str) -> Result<&str, String> {
        match self.typed(name)? {
            Value::Text(v) => Ok(v),
            other => Err(wrong_type(name, "text", other)),
        }
    }

    /// A float-list parameter.
    pub fn float_list(&self, name: &str) -> Result<&[f64], String> {
        match self.typed(name)? {
            Value::FloatList(v) => Ok(v),
            other => Err(wrong_type(name, "a list of floats", other)),
        }
    }

    fn typed(&self, name: &str) -> Result<&Value, String> {
        self.get(name)
            .ok_or_else(|| format!("missing parameter '{name}'"))
    }
}

fn describe(v: &Value) -> &'static str {
    match v {
        Value::Boolean(_) => "a boolean",
        Value::Integer(_) => "an integer",
        Value::Float(_) => "a float",
        Value::Text(_) => "text",
        Value::FloatList(_) => "a list of floats",
    }
}

fn wrong_type(name: &str, want: &str, got: &Value) -> String {
    format!("parameter '{name}' must be {want}, got {}", describe(got))
}

fn check_type(spec: &ParamSpec, value: &Value) -> Result<(), String> {
    let name = &spec.name;
    match (&spec.ty, value) {
        (ParamType::Boolean, Value::Boolean(_))
        | (ParamType::Integer, Value::Integer(_))
        | (ParamType::Float, Value::Float(_))
        | (ParamType::Text, Value::Text(_))
        | (ParamType::FloatList, Value::FloatList(_)) => Ok(()),
        (ParamType::Choice(words), Value::Text(w)) if words.contains(w) => Ok(()),
        (ParamType::Choice(words), Value::Text(w)) => Err(format!(
            "parameter '{name}' must be one of {}, got '{w}'",
            words.join(", ")
        )),
        (ParamType::Boolean, v) => Err(wrong_type(name, "a boolean", v)),
        (ParamType::Integer, v) => Err(wrong_type(name, "an integer", v)),
        (ParamType::Float, v) => Err(wrong_type(name, "a float", v)),
        (ParamType::Text | ParamType::Choice(_), v) => Err(wrong_type(name, "text", v)),
        (ParamType::FloatList, v) => Err(wrong_type(name, "a list of floats", v)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn specs() -> Vec<ParamSpec> {
        vec![
            ParamSpec::float("gamma", 0.1, "decay"),
            ParamSpec::choice("scaling", &["linear", "sqrt"], "rule"),
            ParamSpec::new("required", ParamType::Integer, None, "no default"),
        ]
    }

    #[test]
    fn defaults_skip_required() {
        let p = Params::defaults(&specs());
        assert_eq!(p.float("gamma"), Ok(0.1));
        assert_eq!(p.text("scaling"), Ok("linear"));
        assert_eq!(
            p.integer("required"),
            Err("missing parameter 'required'".into())
        );
    }

    #[test]
    fn resolve_overlays_and_checks() {
        let p = Params::resolve(&specs(), vec![("required".into(), Value::Integer(3))]).unwrap();
        assert_eq!(p.integer("required"), Ok(3));
        assert_eq!(p.float("gamma"), Ok(0.1));
        assert_eq!(p.0[0].0, "gamma", "declaration order is kept");

        let err = |given: Vec<(String, Value)>| Params::resolve(&specs(), given).unwrap_err();
        assert_eq!(err(vec![]), "missing required parameter 'required'");
        assert_eq!(
            err(vec![("nope".into(), Value::Boolean(true))]),
            "unknown parameter 'nope' (accepted: gamma, scaling, required)"
        );
        assert_eq!(
            err(vec![("scaling".into(), Value::Text("cubic".into()))]),
            "parameter 'scaling' must be one of linear, sqrt, got 'cubic'"
        );
        assert_eq!(
            err(vec![("gamma".into(), Value::Integer(1))]),
            "parameter 'gamma' must be a float, got an integer"
        );
    }

    #[test]
    fn getters_name_the_parameter() {
        let p = Params(vec![("x".into(), Value::Boolean(true))]);
        assert_eq!(p.boolean("x"), Ok(true));
        assert_eq!(
            p.float("x"),
            Err("parameter 'x' must be a float, got a boolean".into())
        );
        assert_eq!(
            p.float_list("x"),
            Err("parameter 'x' must be a list of floats, got a boolean".into())
        );
        assert_eq!(p.text("y"), Err("missing parameter 'y'".into()));
    }
}
