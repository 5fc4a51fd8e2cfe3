//! The expression form's evaluation: Python's semantics on JSON values for the operations the
//! IR has, each node one step of the budget, every result bounded in size. A Python error
//! (a missing key, a type mismatch, a division by zero) is raised in the flow as Python would
//! (an `except` may catch it); running out of budget or size stops the flow.

use serde_json::{Map, Number, Value};

use crate::error::FlowError;
use crate::ir::{BinOp, Builtin, CmpOp, Expr, Method};

/// Longest string or list an expression may build (`"x" * n`, `a + b`).
pub const MAX_LEN: usize = 1 << 20;

/// Why an evaluation stopped early.
#[derive(Debug, Clone, PartialEq)]
pub enum Stop {
    /// A Python exception, catchable by the flow's `except`.
    Raise(FlowError),
    /// A limit of the platform (budget, size, a malformed program): the flow ends in x-sump.
    Abort(String),
}

/// What an expression can see, and its budget.
pub struct Scope<'a> {
    pub state: &'a Value,
    pub var: Option<(&'a str, &'a Value)>,
    pub line: u32,
    pub steps: &'a mut u32,
}

impl Scope<'_> {
    fn raise<T>(&self, ty: &str, msg: impl Into<String>) -> Result<T, Stop> {
        Err(Stop::Raise(FlowError::raised(ty, msg, self.line)))
    }

    fn tick(&mut self) -> Result<(), Stop> {
        if *self.steps == 0 {
            return Err(Stop::Abort(format!(
                "flow step budget exhausted at line {}",
                self.line
            )));
        }
        *self.steps -= 1;
        Ok(())
    }

    pub fn eval(&mut self, e: &Expr) -> Result<Value, Stop> {
        self.tick()?;
        match e {
            Expr::Const(v) => Ok(v.clone()),
            Expr::State => Ok(self.state.clone()),
            Expr::Var(name) => match self.var {
                Some((n, v)) if n == name => Ok(v.clone()),
                _ => self.raise("NameError", format!("name '{name}' is not defined")),
            },
            Expr::Index(of, key) => {
                let of = self.eval(of)?;
                let key = self.eval(key)?;
                self.index(&of, &key).cloned()
            }
            Expr::Not(x) => Ok(Value::Bool(!truthy(&self.eval(x)?))),
            Expr::Neg(x) => match num(&self.eval(x)?) {
                Some(Num::Int(i)) => match i.checked_neg() {
                    Some(n) => Ok(Value::from(n)),
                    None => self.raise("OverflowError", "integer overflow"),
                },
                Some(Num::Float(f)) => self.float(-f),
                None => self.raise("TypeError", "bad operand type for unary -"),
            },
            Expr::And(xs) => {
                let mut last = Value::Bool(true);
                for x in xs {
                    last = self.eval(x)?;
                    if !truthy(&last) {
                        break;
                    }
                }
                Ok(last)
            }
            Expr::Or(xs) => {
                let mut last = Value::Bool(false);
                for x in xs {
                    last = self.eval(x)?;
                    if truthy(&last) {
                        break;
                    }
                }
                Ok(last)
            }
            Expr::Compare { left, ops } => {
                let mut l = self.eval(left)?;
                for (op, right) in ops {
                    let r = self.eval(right)?;
                    if !self.compare(*op, &l, &r)? {
                        return Ok(Value::Bool(false));
                    }
                    l = r;
                }
                Ok(Value::Bool(true))
            }
            Expr::Bin(op, l, r) => {
                let l = self.eval(l)?;
                let r = self.eval(r)?;
                self.binop(*op, &l, &r)
            }
            Expr::IfElse(cond, then, other) => {
                if truthy(&self.eval(cond)?) {
                    self.eval(then)
                } else {
                    self.eval(other)
                }
            }
            Expr::List(xs) => Ok(Value::Array(
                xs.iter().map(|x| self.eval(x)).collect::<Result<_, _>>()?,
            )),
            Expr::Dict(kvs) => {
                let mut m = Map::new();
                for (k, v) in kvs {
                    let key = match self.eval(k)? {
                        Value::String(s) => s,
                        other => {
                            return self.raise(
                                "TypeError",
                                format!("a JSON object key must be a str, not {}", py_type(&other)),
                            );
                        }
                    };
                    let v = self.eval(v)?;
                    m.insert(key, v);
                }
                Ok(Value::Object(m))
            }
            Expr::Builtin(f, args) => {
                let args: Vec<Value> = args
                    .iter()
                    .map(|x| self.eval(x))
                    .collect::<Result<_, _>>()?;
                self.builtin(*f, &args)
            }
            Expr::Method(of, m, args) => {
                let of = self.eval(of)?;
                let args: Vec<Value> = args
                    .iter()
                    .map(|x| self.eval(x))
                    .collect::<Result<_, _>>()?;
                self.method(&of, *m, &args)
            }
        }
    }

    /// `of[key]` as Python reads it: a dict by str key, a list or str by int index (negative
    /// from the end).
    pub fn index<'v>(&self, of: &'v Value, key: &Value) -> Result<&'v Value, Stop> {
        match (of, key) {
            (Value::Object(m), Value::String(k)) => match m.get(k) {
                Some(v) => Ok(v),
                None => self.raise("KeyError", format!("'{k}'")),
            },
            (Value::Object(_), k) => self.raise("KeyError", value_repr(k)),
            (Value::Array(a), k) => match self.position(a.len(), k)? {
                Some(i) => Ok(&a[i]),
                None => self.raise("IndexError", "list index out of range"),
            },
            (other, _) => self.raise(
                "TypeError",
                format!("'{}' object is not subscriptable", py_type(other)),
            ),
        }
    }

    /// A list position from a Python index: `None` when out of range.
    pub fn position(&self, len: usize, key: &Value) -> Result<Option<usize>, Stop> {
        let Some(Num::Int(i)) = num(key).filter(|_| !key.is_boolean()) else {
            return self.raise(
                "TypeError",
                format!("list indices must be integers, not {}", py_type(key)),
            );
        };
        let len = len as i64;
        let i = if i < 0 { i + len } else { i };
        Ok((0..len).contains(&i).then_some(i as usize))
    }

    fn float(&self, f: f64) -> Result<Value, Stop> {
        match Number::from_f64(f) {
            Some(n) => Ok(Value::Number(n)),
            None => self.raise("ValueError", format!("{f} is not a JSON number")),
        }
    }

    fn compare(&self, op: CmpOp, l: &Value, r: &Value) -> Result<bool, Stop> {
        use std::cmp::Ordering::*;
        Ok(match op {
            CmpOp::Eq => py_eq(l, r),
            CmpOp::NotEq => !py_eq(l, r),
            CmpOp::Is => l.is_null() && r.is_null() || (l.is_boolean() && l == r),
            CmpOp::IsNot => !(l.is_null() && r.is_null() || (l.is_boolean() && l == r)),
            CmpOp::In => self.contains(r, l)?,
            CmpOp::NotIn => !self.contains(r, l)?,
            CmpOp::Lt | CmpOp::LtE | CmpOp::Gt | CmpOp::GtE => {
                let Some(ord) = py_cmp(l, r) else {
                    return self.raise(
                        "TypeError",
                        format!(
                            "'{}' not supported between instances of '{}' and '{}'",
                            match op {
                                CmpOp::Lt => "<",
                                CmpOp::LtE => "<=",
                                CmpOp::Gt => ">",
                                _ => ">=",
                            },
                            py_type(l),
                            py_type(r)
                        ),
                    );
                };
                match op {
                    CmpOp::Lt => ord == Less,
                    CmpOp::LtE => ord != Greater,
                    CmpOp::Gt => ord == Greater,
                    _ => ord != Less,
                }
            }
        })
    }

    fn contains(&self, container: &Value, item: &Value) -> Result<bool, Stop> {
        match (container, item) {
            (Value::String(s), Value::String(i)) => Ok(s.contains(i.as_str())),
            (Value::String(_), other) => self.raise(
                "TypeError",
                format!(
                    "'in <string>' requires string as left operand, not {}",
                    py_type(other)
                ),
            ),
            (Value::Array(a), i) => Ok(a.iter().any(|x| py_eq(x, i))),
            (Value::Object(m), Value::String(k)) => Ok(m.contains_key(k)),
            (Value::Object(_), _) => Ok(false),
            (other, _) => self.raise(
                "TypeError",
                format!("argument of type '{}' is not iterable", py_type(other)),
            ),
        }
    }

    fn binop(&self, op: BinOp, l: &Value, r: &Value) -> Result<Value, Stop> {
        if let (Some(a), Some(b)) = (num(l), num(r)) {
            return self.arith(op, a, b);
        }
        match (op, l, r) {
            (BinOp::Add, Value::String(a), Value::String(b)) => {
                self.bounded(a.len() + b.len())?;
                Ok(Value::String(format!("{a}{b}")))
            }
            (BinOp::Add, Value::Array(a), Value::Array(b)) => {
                self.bounded(a.len() + b.len())?;
                Ok(Value::Array(a.iter().chain(b).cloned().collect()))
            }
            (BinOp::Mul, Value::String(s), n) | (BinOp::Mul, n, Value::String(s))
                if matches!(num(n), Some(Num::Int(_))) =>
            {
                let times = repeat_count(n);
                self.bounded(s.len().saturating_mul(times))?;
                Ok(Value::String(s.repeat(times)))
            }
            (BinOp::Mul, Value::Array(a), n) | (BinOp::Mul, n, Value::Array(a))
                if matches!(num(n), Some(Num::Int(_))) =>
            {
                let times = repeat_count(n);
                self.bounded(a.len().saturating_mul(times))?;
                Ok(Value::Array(
                    std::iter::repeat_n(a.iter(), times)
                        .flatten()
                        .cloned()
                        .collect(),
                ))
            }
            _ => self.raise(
                "TypeError",
                format!(
                    "unsupported operand type(s) for {}: '{}' and '{}'",
                    op_symbol(op),
                    py_type(l),
                    py_type(r)
                ),
            ),
        }
    }

    fn bounded(&self, len: usize) -> Result<(), Stop> {
        if len > MAX_LEN {
            return Err(Stop::Abort(format!(
                "flow expression at line {} builds a value of {len} items, over the limit of {MAX_LEN}",
                self.line
            )));
        }
        Ok(())
    }

    fn arith(&self, op: BinOp, a: Num, b: Num) -> Result<Value, Stop> {
        let overflow = || {
            Stop::Raise(FlowError::raised(
                "OverflowError",
                "integer overflow",
                self.line,
            ))
        };
        let zero = |what: &str| {
            Stop::Raise(FlowError::raised(
                "ZeroDivisionError",
                what.to_string(),
                self.line,
            ))
        };
        if let (Num::Int(x), Num::Int(y)) = (a, b) {
            return match op {
                BinOp::Add => x.checked_add(y).map(Value::from).ok_or_else(overflow),
                BinOp::Sub => x.checked_sub(y).map(Value::from).ok_or_else(overflow),
                BinOp::Mul => x.checked_mul(y).map(Value::from).ok_or_else(overflow),
                BinOp::Div if y == 0 => Err(zero("division by zero")),
                BinOp::Div => self.float(x as f64 / y as f64),
                BinOp::FloorDiv | BinOp::Mod if y == 0 => {
                    Err(zero("integer division or modulo by zero"))
                }
                BinOp::FloorDiv => {
                    let q = x.checked_div(y).ok_or_else(overflow)?;
                    let floor = if (x % y != 0) && ((x < 0) != (y < 0)) {
                        q - 1
                    } else {
                        q
                    };
                    Ok(Value::from(floor))
                }
                BinOp::Mod => {
                    let m = x.checked_rem(y).ok_or_else(overflow)?;
                    Ok(Value::from(if m != 0 && ((m < 0) != (y < 0)) {
                        m + y
                    } else {
                        m
                    }))
                }
            };
        }
        let (x, y) = (a.as_f64(), b.as_f64());
        match op {
            BinOp::Add => self.float(x + y),
            BinOp::Sub => self.float(x - y),
            BinOp::Mul => self.float(x * y),
            BinOp::Div | BinOp::FloorDiv | BinOp::Mod if y == 0.0 => {
                Err(zero("float division by zero"))
            }
            BinOp::Div => self.float(x / y),
            BinOp::FloorDiv => self.float((x / y).floor()),
            BinOp::Mod => self.float(x - y * (x / y).floor()),
        }
    }

    fn builtin(&self, f: Builtin, args: &[Value]) -> Result<Value, Stop> {
        let one = |name: &str| -> Result<&Value, Stop> {
            match args {
                [a] => Ok(a),
                _ => self.raise(
                    "TypeError",
                    format!("{name}() takes exactly one argument ({} given)", args.len()),
                ),
            }
        };
        match f {
            Builtin::Len => match one("len")? {
                Value::String(s) => Ok(Value::from(s.chars().count())),
                Value::Array(a) => Ok(Value::from(a.len())),
                Value::Object(m) => Ok(Value::from(m.len())),
                other => self.raise(
                    "TypeError",
                    format!("object of type '{}' has no len()", py_type(other)),
                ),
            },
            Builtin::Abs => match num(one("abs")?) {
                Some(Num::Int(i)) => i.checked_abs().map(Value::from).ok_or_else(|| {
                    Stop::Raise(FlowError::raised(
                        "OverflowError",
                        "integer overflow",
                        self.line,
                    ))
                }),
                Some(Num::Float(x)) => self.float(x.abs()),
                None => self.raise("TypeError", "bad operand type for abs()"),
            },
            Builtin::Min | Builtin::Max => {
                let items: &[Value] = match args {
                    [Value::Array(a)] => a,
                    [_] | [] => {
                        return self.raise(
                            "TypeError",
                            "min()/max() needs a list or two or more arguments",
                        );
                    }
                    many => many,
                };
                let mut best: Option<&Value> = None;
                for v in items {
                    best = Some(match best {
                        None => v,
                        Some(b) => {
                            let ord = py_cmp(v, b).ok_or_else(|| {
                                Stop::Raise(FlowError::raised(
                                    "TypeError",
                                    format!("cannot compare '{}' and '{}'", py_type(v), py_type(b)),
                                    self.line,
                                ))
                            })?;
                            let better = if f == Builtin::Min {
                                ord == std::cmp::Ordering::Less
                            } else {
                                ord == std::cmp::Ordering::Greater
                            };
                            if better { v } else { b }
                        }
                    });
                }
                match best {
                    Some(b) => Ok(b.clone()),
                    None => self.raise("ValueError", "min()/max() arg is an empty sequence"),
                }
            }
            Builtin::Int => match one("int")? {
                Value::Bool(b) => Ok(Value::from(*b as i64)),
                Value::Number(_) => match num(&args[0]) {
                    Some(Num::Int(i)) => Ok(Value::from(i)),
                    Some(Num::Float(x)) if x.is_finite() && x.abs() < 9.2e18 => {
                        Ok(Value::from(x.trunc() as i64))
                    }
                    _ => self.raise("OverflowError", "cannot convert float to integer"),
                },
                Value::String(s) => match s.trim().parse::<i64>() {
                    Ok(i) => Ok(Value::from(i)),
                    Err(_) => self.raise(
                        "ValueError",
                        format!("invalid literal for int() with base 10: '{s}'"),
                    ),
                },
                other => self.raise(
                    "TypeError",
                    format!(
                        "int() argument must be a string or a number, not '{}'",
                        py_type(other)
                    ),
                ),
            },
            Builtin::Float => match one("float")? {
                Value::String(s) => match s.trim().parse::<f64>() {
                    Ok(x) => self.float(x),
                    Err(_) => self.raise(
                        "ValueError",
                        format!("could not convert string to float: '{s}'"),
                    ),
                },
                v => match num(v) {
                    Some(n) => self.float(n.as_f64()),
                    None => self.raise(
                        "TypeError",
                        format!(
                            "float() argument must be a string or a number, not '{}'",
                            py_type(v)
                        ),
                    ),
                },
            },
            Builtin::Str => Ok(Value::String(match one("str")? {
                Value::String(s) => s.clone(),
                other => value_repr(other),
            })),
            Builtin::Bool => Ok(Value::Bool(truthy(one("bool")?))),
        }
    }

    fn method(&self, of: &Value, m: Method, args: &[Value]) -> Result<Value, Stop> {
        match (m, of) {
            (Method::Get, Value::Object(map)) => match args {
                [Value::String(k)] => Ok(map.get(k).cloned().unwrap_or(Value::Null)),
                [Value::String(k), d] => Ok(map.get(k).cloned().unwrap_or_else(|| d.clone())),
                [_] | [_, _] => Ok(args.get(1).cloned().unwrap_or(Value::Null)),
                _ => self.raise("TypeError", "get expected 1 or 2 arguments"),
            },
            (Method::Lower, Value::String(s)) if args.is_empty() => {
                Ok(Value::String(s.to_lowercase()))
            }
            (Method::Upper, Value::String(s)) if args.is_empty() => {
                Ok(Value::String(s.to_uppercase()))
            }
            (Method::Strip, Value::String(s)) if args.is_empty() => {
                Ok(Value::String(s.trim().to_string()))
            }
            (Method::Startswith, Value::String(s)) => match args {
                [Value::String(p)] => Ok(Value::Bool(s.starts_with(p.as_str()))),
                _ => self.raise("TypeError", "startswith takes one str argument"),
            },
            (Method::Endswith, Value::String(s)) => match args {
                [Value::String(p)] => Ok(Value::Bool(s.ends_with(p.as_str()))),
                _ => self.raise("TypeError", "endswith takes one str argument"),
            },
            (m, v) => self.raise(
                "AttributeError",
                format!(
                    "'{}' object has no attribute '{:?}' taking {} arguments",
                    py_type(v),
                    m,
                    args.len()
                ),
            ),
        }
    }
}

fn repeat_count(n: &Value) -> usize {
    match num(n) {
        Some(Num::Int(i)) if i > 0 => i as usize,
        _ => 0,
    }
}

fn op_symbol(op: BinOp) -> &'static str {
    match op {
        BinOp::Add => "+",
        BinOp::Sub => "-",
        BinOp::Mul => "*",
        BinOp::Div => "/",
        BinOp::FloorDiv => "//",
        BinOp::Mod => "%",
    }
}

#[derive(Debug, Clone, Copy)]
enum Num {
    Int(i64),
    Float(f64),
}

impl Num {
    fn as_f64(self) -> f64 {
        match self {
            Num::Int(i) => i as f64,
            Num::Float(f) => f,
        }
    }
}

/// A number as Python sees it (`bool` is an `int`).
fn num(v: &Value) -> Option<Num> {
    match v {
        Value::Bool(b) => Some(Num::Int(*b as i64)),
        Value::Number(n) => n
            .as_i64()
            .map(Num::Int)
            .or_else(|| n.as_f64().map(Num::Float)),
        _ => None,
    }
}

/// Python's truth value of a JSON value.
pub fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(m) => !m.is_empty(),
    }
}

/// Python's `==`: numbers by value across int and float (and bool), containers deeply.
pub fn py_eq(a: &Value, b: &Value) -> bool {
    match (num(a), num(b)) {
        (Some(Num::Int(x)), Some(Num::Int(y))) => x == y,
        (Some(x), Some(y)) => x.as_f64() == y.as_f64(),
        _ => match (a, b) {
            (Value::Array(x), Value::Array(y)) => {
                x.len() == y.len() && x.iter().zip(y).all(|(p, q)| py_eq(p, q))
            }
            (Value::Object(x), Value::Object(y)) => {
                x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| py_eq(v, w)))
            }
            _ => a == b,
        },
    }
}

/// Python's ordering where it is defined: numbers, strings, lists element by element.
fn py_cmp(a: &Value, b: &Value) -> Option<std::cmp::Ordering> {
    match (num(a), num(b)) {
        (Some(Num::Int(x)), Some(Num::Int(y))) => Some(x.cmp(&y)),
        (Some(x), Some(y)) => x.as_f64().partial_cmp(&y.as_f64()),
        _ => match (a, b) {
            (Value::String(x), Value::String(y)) => Some(x.cmp(y)),
            (Value::Array(x), Value::Array(y)) => {
                for (p, q) in x.iter().zip(y) {
                    if !py_eq(p, q) {
                        return py_cmp(p, q);
                    }
                }
                Some(x.len().cmp(&y.len()))
            }
            _ => None,
        },
    }
}

/// Python's name for a JSON value's type, for messages.
pub fn py_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "NoneType",
        Value::Bool(_) => "bool",
        Value::Number(n) if n.is_f64() => "float",
        Value::Number(_) => "int",
        Value::String(_) => "str",
        Value::Array(_) => "list",
        Value::Object(_) => "dict",
    }
}

fn value_repr(v: &Value) -> String {
    match v {
        Value::Null => "None".into(),
        Value::Bool(true) => "True".into(),
        Value::Bool(false) => "False".into(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn c(v: Value) -> Expr {
        Expr::Const(v)
    }
    fn key(k: &str) -> Expr {
        Expr::Index(Box::new(Expr::State), Box::new(c(json!(k))))
    }
    fn run(e: &Expr, state: Value) -> Result<Value, Stop> {
        let mut steps = 1000;
        Scope {
            state: &state,
            var: None,
            line: 7,
            steps: &mut steps,
        }
        .eval(e)
    }
    fn raised(r: Result<Value, Stop>) -> String {
        match r {
            Err(Stop::Raise(e)) => e.error_type,
            other => panic!("expected a raise, got {other:?}"),
        }
    }

    #[test]
    fn lookups_raise_as_python_does() {
        let s = json!({"a": {"b": [1, 2, 3]}});
        let b = Expr::Index(Box::new(key("a")), Box::new(c(json!("b"))));
        assert_eq!(
            run(
                &Expr::Index(Box::new(b.clone()), Box::new(c(json!(-1)))),
                s.clone()
            )
            .unwrap(),
            json!(3)
        );
        assert_eq!(raised(run(&key("zz"), s.clone())), "KeyError");
        assert_eq!(
            raised(run(
                &Expr::Index(Box::new(b.clone()), Box::new(c(json!(3)))),
                s.clone()
            )),
            "IndexError"
        );
        assert_eq!(
            raised(run(
                &Expr::Index(Box::new(b), Box::new(c(json!("x")))),
                s.clone()
            )),
            "TypeError"
        );
        let get = Expr::Method(
            Box::new(Expr::State),
            Method::Get,
            vec![c(json!("zz")), c(json!(5))],
        );
        assert_eq!(run(&get, s).unwrap(), json!(5));
    }

    #[test]
    fn arithmetic_follows_python() {
        let bin =
            |op, a: Value, b: Value| run(&Expr::Bin(op, Box::new(c(a)), Box::new(c(b))), json!({}));
        assert_eq!(
            bin(BinOp::FloorDiv, json!(-7), json!(2)).unwrap(),
            json!(-4)
        );
        assert_eq!(bin(BinOp::Mod, json!(-7), json!(2)).unwrap(), json!(1));
        assert_eq!(bin(BinOp::Div, json!(7), json!(2)).unwrap(), json!(3.5));
        assert_eq!(bin(BinOp::Add, json!(1), json!(0.5)).unwrap(), json!(1.5));
        assert_eq!(
            bin(BinOp::Add, json!("a"), json!("b")).unwrap(),
            json!("ab")
        );
        assert_eq!(
            bin(BinOp::Mul, json!([0]), json!(3)).unwrap(),
            json!([0, 0, 0])
        );
        assert_eq!(
            raised(bin(BinOp::Div, json!(1), json!(0))),
            "ZeroDivisionError"
        );
        assert_eq!(raised(bin(BinOp::Add, json!("a"), json!(1))), "TypeError");
        assert_eq!(
            raised(bin(BinOp::Add, json!(i64::MAX), json!(1))),
            "OverflowError"
        );
        // A repetition past the size bound is the platform's stop, not a Python error.
        assert!(matches!(
            bin(BinOp::Mul, json!("ab"), json!(1 << 20)),
            Err(Stop::Abort(_))
        ));
    }

    #[test]
    fn comparisons_truth_and_membership() {
        let cmp = |l: Value, ops: Vec<(CmpOp, Value)>| {
            run(
                &Expr::Compare {
                    left: Box::new(c(l)),
                    ops: ops.into_iter().map(|(o, v)| (o, c(v))).collect(),
                },
                json!({}),
            )
        };
        assert_eq!(
            cmp(json!(1), vec![(CmpOp::Lt, json!(2)), (CmpOp::Lt, json!(3))]).unwrap(),
            json!(true)
        );
        assert_eq!(
            cmp(json!(1), vec![(CmpOp::Lt, json!(2)), (CmpOp::Gt, json!(3))]).unwrap(),
            json!(false)
        );
        assert_eq!(
            cmp(json!(1), vec![(CmpOp::Eq, json!(1.0))]).unwrap(),
            json!(true)
        );
        assert_eq!(
            cmp(json!("b"), vec![(CmpOp::In, json!(["a", "b"]))]).unwrap(),
            json!(true)
        );
        assert_eq!(
            cmp(json!("k"), vec![(CmpOp::NotIn, json!({"k": 1}))]).unwrap(),
            json!(false)
        );
        assert_eq!(
            cmp(json!(null), vec![(CmpOp::Is, json!(null))]).unwrap(),
            json!(true)
        );
        assert_eq!(
            raised(cmp(json!("a"), vec![(CmpOp::Lt, json!(1))])),
            "TypeError"
        );
        // `and`/`or` return the deciding operand and short-circuit: the KeyError is never raised.
        let or = Expr::Or(vec![
            c(json!("")),
            c(json!(0)),
            c(json!("x")),
            key("missing"),
        ]);
        assert_eq!(run(&or, json!({})).unwrap(), json!("x"));
        let and = Expr::And(vec![c(json!(1)), c(json!([])), key("missing")]);
        assert_eq!(run(&and, json!({})).unwrap(), json!([]));
    }

    #[test]
    fn the_budget_bounds_every_expression() {
        let deep = (0..50).fold(c(json!(1)), |e, _| Expr::Not(Box::new(e)));
        let mut steps = 10;
        let r = Scope {
            state: &json!({}),
            var: None,
            line: 3,
            steps: &mut steps,
        }
        .eval(&deep);
        assert!(matches!(r, Err(Stop::Abort(m)) if m.contains("budget")));
    }
}
