//! Python flow source → [`Program`] (docs/flows.md). The same source as the original Asya's
//! flow DSL: one function taking and returning the state dict, its `await`s actor calls.
//! Whatever has no exact meaning in the IR is refused with its line, the construct and what
//! to write instead; nothing is compiled approximately.

use std::collections::HashMap;

use rustpython_parser::ast::{self, Constant, Ranged};
use serde_json::{Value, json};

use asya_flow::ir::{
    BinOp, BranchCall, Builtin, CmpOp, DEFAULT_STEP_BUDGET, Expr, FanOutBranches, Handler,
    IR_VERSION, Instr, Method, NewError, Program,
};

/// One refusal: where, what, why and what to write instead.
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    pub line: u32,
    pub construct: String,
    pub why: String,
    pub instead: String,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "line {}: {} is not supported in a flow: {}; instead: {}",
            self.line, self.construct, self.why, self.instead
        )
    }
}

/// A compiled flow: the program and what the manifests need.
#[derive(Debug, Clone, PartialEq)]
pub struct Compiled {
    pub program: Program,
    /// The flow function's docstring, whitespace collapsed (the gateway's tool description).
    pub description: Option<String>,
    /// Each actor called: its name (a DNS label) and its handler (`module.function`).
    pub actors: Vec<ActorRef>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ActorRef {
    pub actor: String,
    pub handler: String,
}

#[derive(Debug, Clone)]
pub struct Options {
    /// The flow function, when the file has several candidates and no `@flow`.
    pub flow: Option<String>,
    /// The Python module the handlers live in (`handlers` → `handlers.classify`).
    pub module: String,
    pub max_iterations: u32,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            flow: None,
            module: "handlers".into(),
            max_iterations: asya_flow::ir::DEFAULT_MAX_ITERATIONS,
        }
    }
}

/// Compiles the flow in `source`; every refusal at once.
pub fn compile(source: &str, file: &str, opts: &Options) -> Result<Compiled, Vec<Refusal>> {
    let lines = Lines::new(source);
    let suite = match <ast::Suite as rustpython_parser::Parse>::parse(source, file) {
        Ok(s) => s,
        Err(e) => {
            return Err(vec![Refusal {
                line: lines.of(e.offset),
                construct: "this text".into(),
                why: format!("it is not valid Python ({})", e.error),
                instead: "fix the syntax (python3 -m py_compile FILE)".into(),
            }]);
        }
    };
    let funcs = functions(&suite);
    let flow = match find_flow(&funcs, opts, &lines) {
        Ok(i) => &funcs[i],
        Err(r) => return Err(vec![r]),
    };
    let mut c = Compiler {
        lines: &lines,
        funcs: &funcs,
        opts,
        code: Vec::new(),
        refusals: Vec::new(),
        regions: Vec::new(),
        loops: Vec::new(),
        next_loop: 0,
        frames: Vec::new(),
        actors: Vec::new(),
        instances: HashMap::new(),
    };
    c.function(flow, true);
    if c.refusals.is_empty() && c.actors.is_empty() {
        c.refuse(
            lines.of(flow.line_offset),
            "a flow without an actor call",
            "there is nothing to route",
            "call at least one actor: `state = await handler(state)`",
        );
    }
    if !c.refusals.is_empty() {
        c.refusals.sort_by_key(|r| r.line);
        return Err(c.refusals);
    }
    let mut program = Program {
        ir: IR_VERSION,
        flow: flow.name.to_string(),
        version: String::new(),
        max_iterations: opts.max_iterations,
        step_budget: DEFAULT_STEP_BUDGET,
        code: c.code,
    };
    program.version = version_of(&program);
    Ok(Compiled {
        program,
        description: docstring(flow.body),
        actors: c.actors,
    })
}

/// The docstring of a function body, its whitespace collapsed; `None` when there is none.
fn docstring(body: &[ast::Stmt]) -> Option<String> {
    let ast::Stmt::Expr(e) = body.first()? else {
        return None;
    };
    let ast::Expr::Constant(c) = e.value.as_ref() else {
        return None;
    };
    let ast::Constant::Str(s) = &c.value else {
        return None;
    };
    let text = s.split_whitespace().collect::<Vec<_>>().join(" ");
    (!text.is_empty()).then_some(text)
}

/// A short content hash of the program (FNV-1a over its JSON): the same source and options
/// give the same version.
fn version_of(p: &Program) -> String {
    let text = serde_json::to_vec(&(&p.flow, p.max_iterations, p.step_budget, &p.code))
        .unwrap_or_default();
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// Byte offsets → 1-based line numbers.
struct Lines(Vec<usize>);

impl Lines {
    fn new(src: &str) -> Lines {
        let mut starts = vec![0];
        starts.extend(src.match_indices('\n').map(|(i, _)| i + 1));
        Lines(starts)
    }
    fn of(&self, offset: impl Into<u32>) -> u32 {
        let off = offset.into() as usize;
        self.0.partition_point(|&s| s <= off) as u32
    }
    fn at<T: Ranged>(&self, node: &T) -> u32 {
        self.of(node.start())
    }
}

/// A top-level function of the file.
struct Func<'a> {
    name: &'a str,
    line_offset: u32,
    param: Option<&'a str>,
    typed: bool,
    decorated_flow: bool,
    body: &'a [ast::Stmt],
}

fn functions(suite: &[ast::Stmt]) -> Vec<Func<'_>> {
    let mut out = Vec::new();
    for s in suite {
        let (name, args, body, decos, returns) = match s {
            ast::Stmt::FunctionDef(f) => (&f.name, &f.args, &f.body, &f.decorator_list, &f.returns),
            ast::Stmt::AsyncFunctionDef(f) => {
                (&f.name, &f.args, &f.body, &f.decorator_list, &f.returns)
            }
            _ => continue,
        };
        let single = args.posonlyargs.is_empty()
            && args.args.len() == 1
            && args.vararg.is_none()
            && args.kwonlyargs.is_empty()
            && args.kwarg.is_none();
        let is_dict = |e: &Option<Box<ast::Expr>>| matches!(e.as_deref(), Some(ast::Expr::Name(n)) if n.id.as_str() == "dict");
        let param = single.then(|| args.args[0].def.arg.as_str());
        let typed = single && is_dict(&args.args[0].def.annotation) && is_dict(returns);
        let decorated_flow = decos
            .iter()
            .any(|d| matches!(d, ast::Expr::Name(n) if n.id.as_str() == "flow"));
        out.push(Func {
            name: name.as_str(),
            line_offset: s.start().into(),
            param,
            typed,
            decorated_flow,
            body,
        });
    }
    out
}

/// The index of the flow function among `funcs`.
fn find_flow(funcs: &[Func<'_>], opts: &Options, lines: &Lines) -> Result<usize, Refusal> {
    let no_flow = |why: String| Refusal {
        line: 1,
        construct: "this file".into(),
        why,
        instead: "write one function `async def my_flow(state: dict) -> dict:` (mark it `@flow` \
                  when the file has several, or pass --flow NAME)"
            .into(),
    };
    let pick = if let Some(name) = &opts.flow {
        funcs
            .iter()
            .position(|f| f.name == name)
            .ok_or_else(|| no_flow(format!("it has no function {name:?}")))?
    } else {
        let marked: Vec<usize> = (0..funcs.len())
            .filter(|&i| funcs[i].decorated_flow)
            .collect();
        let typed: Vec<usize> = (0..funcs.len()).filter(|&i| funcs[i].typed).collect();
        match (marked.as_slice(), typed.as_slice()) {
            ([one], _) => *one,
            ([], [one]) => *one,
            ([], []) => {
                return Err(no_flow(
                    "it has no flow function (one parameter annotated `dict`, returning `dict`)"
                        .into(),
                ));
            }
            ([], many) | (many, _) => {
                // Sub-flows have the flow signature too: the flow is the one no other calls.
                let called = |name: &str| {
                    funcs
                        .iter()
                        .any(|f| f.name != name && calls_name(f.body, name))
                };
                let roots: Vec<usize> = many
                    .iter()
                    .copied()
                    .filter(|&i| !called(funcs[i].name))
                    .collect();
                match roots.as_slice() {
                    [one] => *one,
                    _ => {
                        let names: Vec<&str> = many.iter().map(|&i| funcs[i].name).collect();
                        return Err(no_flow(format!(
                            "it has several flow functions ({})",
                            names.join(", ")
                        )));
                    }
                }
            }
        }
    };
    let f = &funcs[pick];
    if f.param.is_none() {
        return Err(Refusal {
            line: lines.of(f.line_offset),
            construct: format!("the signature of {}", f.name),
            why: "a flow takes exactly one parameter, the state".into(),
            instead: format!("`async def {}(state: dict) -> dict:`", f.name),
        });
    }
    Ok(pick)
}

/// Whether `body` calls `name(...)` anywhere (a cheap textual walk of the statements).
fn calls_name(body: &[ast::Stmt], name: &str) -> bool {
    fn in_expr(e: &ast::Expr, name: &str) -> bool {
        match e {
            ast::Expr::Call(c) => {
                matches!(c.func.as_ref(), ast::Expr::Name(n) if n.id.as_str() == name)
                    || c.args.iter().any(|a| in_expr(a, name))
            }
            ast::Expr::Await(a) => in_expr(&a.value, name),
            _ => false,
        }
    }
    body.iter().any(|s| match s {
        ast::Stmt::Assign(a) => in_expr(&a.value, name),
        ast::Stmt::If(i) => calls_name(&i.body, name) || calls_name(&i.orelse, name),
        ast::Stmt::While(w) => calls_name(&w.body, name),
        ast::Stmt::Try(t) => {
            calls_name(&t.body, name)
                || calls_name(&t.orelse, name)
                || t.handlers.iter().any(|h| {
                    let ast::ExceptHandler::ExceptHandler(h) = h;
                    calls_name(&h.body, name)
                })
        }
        _ => false,
    })
}

/// A region of code a jump out of must close: its instruction on the way out.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Region {
    Try,
    Except,
    Loop,
}

struct LoopCtx {
    top: usize,
    breaks: Vec<usize>,
    /// `regions.len()` inside the loop.
    depth: usize,
}

/// An inlined sub-flow (or the flow itself): its parameter and its `return`s.
struct Frame<'a> {
    name: &'a str,
    param: &'a str,
    /// `regions.len()` at the call.
    depth: usize,
    loops: usize,
    returns: Vec<usize>,
    top: bool,
}

struct Compiler<'a, 'o> {
    lines: &'o Lines,
    funcs: &'o [Func<'a>],
    opts: &'o Options,
    code: Vec<Instr>,
    refusals: Vec<Refusal>,
    regions: Vec<Region>,
    loops: Vec<LoopCtx>,
    next_loop: u32,
    frames: Vec<Frame<'a>>,
    actors: Vec<ActorRef>,
    /// `model = Model()`: instance name → class.
    instances: HashMap<String, String>,
}

/// The alternatives the refusals point to.
const USE_HANDLER: &str = "do it in a handler (an actor) and call it: `state = await step(state)`";

impl<'a> Compiler<'a, '_> {
    fn refuse(&mut self, line: u32, construct: &str, why: &str, instead: &str) {
        self.refusals.push(Refusal {
            line,
            construct: construct.into(),
            why: why.into(),
            instead: instead.into(),
        });
    }

    fn emit(&mut self, i: Instr) -> usize {
        self.code.push(i);
        self.code.len() - 1
    }

    fn param(&self) -> &'a str {
        self.frames.last().map(|f| f.param).unwrap_or("state")
    }

    fn function(&mut self, f: &Func<'a>, top: bool) {
        let Some(param) = f.param else {
            return;
        };
        self.frames.push(Frame {
            name: f.name,
            param,
            depth: self.regions.len(),
            loops: self.loops.len(),
            returns: Vec::new(),
            top,
        });
        self.block(f.body);
        if let Some(frame) = self.frames.pop() {
            let end = self.code.len();
            for at in frame.returns {
                self.code[at] = Instr::Jump { to: end };
            }
        }
    }

    fn block(&mut self, body: &'a [ast::Stmt]) {
        for (i, s) in body.iter().enumerate() {
            // A docstring first in a function or block.
            if i == 0
                && let ast::Stmt::Expr(e) = s
                && matches!(e.value.as_ref(), ast::Expr::Constant(c) if matches!(c.value, Constant::Str(_)))
            {
                continue;
            }
            self.stmt(s);
        }
    }

    fn stmt(&mut self, s: &'a ast::Stmt) {
        let line = self.lines.at(s);
        match s {
            ast::Stmt::Assign(a) => self.assign(a, line),
            ast::Stmt::AugAssign(a) => self.aug_assign(a, line),
            ast::Stmt::Delete(d) => {
                for t in &d.targets {
                    if let Some(target) = self.target(t, line) {
                        self.emit(Instr::Del { target, line });
                    }
                }
            }
            ast::Stmt::If(i) => self.if_(i, line),
            ast::Stmt::While(w) => self.while_(w, line),
            ast::Stmt::Try(t) => self.try_(t, line),
            ast::Stmt::Raise(r) => self.raise(r, line),
            ast::Stmt::Return(r) => self.return_(r, line),
            ast::Stmt::Pass(_) => {}
            ast::Stmt::Break(_) => self.break_(line),
            ast::Stmt::Continue(_) => self.continue_(line),
            ast::Stmt::Expr(e) => match e.value.as_ref() {
                ast::Expr::Await(_) | ast::Expr::Call(_) => self.refuse(
                    line,
                    "a call whose result is not assigned",
                    "an actor's answer is the new state",
                    "assign it: `state = await handler(state)`",
                ),
                ast::Expr::Yield(_) | ast::Expr::YieldFrom(_) => self.refuse(
                    line,
                    "`yield`",
                    "a flow produces one result, its returned state",
                    "yield inside a handler (its results fan out), or build a list in the state",
                ),
                _ => self.refuse(
                    line,
                    "an expression statement",
                    "it has no effect on the state",
                    "remove it, or assign it: `state[\"k\"] = ...`",
                ),
            },
            ast::Stmt::For(_) | ast::Stmt::AsyncFor(_) => self.refuse(
                line,
                "a `for` loop",
                "flows loop with `while` (the guard counts its iterations)",
                "`while state[\"i\"] < len(state[\"items\"]):` with an index in the state, or a \
                 fan-out `[handler(x) for x in state[\"items\"]]`",
            ),
            ast::Stmt::With(_) | ast::Stmt::AsyncWith(_) => self.refuse(
                line,
                "a `with` block",
                "a context manager's code cannot run between hops",
                USE_HANDLER,
            ),
            ast::Stmt::TryStar(_) => self.refuse(
                line,
                "`try`/`except*`",
                "exception groups have no meaning for one envelope",
                "`try`/`except` by type",
            ),
            ast::Stmt::Import(_) | ast::Stmt::ImportFrom(_) => self.refuse(
                line,
                "an `import` inside the flow",
                "a flow is pure control flow",
                USE_HANDLER,
            ),
            ast::Stmt::Global(_) | ast::Stmt::Nonlocal(_) => self.refuse(
                line,
                "`global`/`nonlocal`",
                "a flow has no variables but its state",
                "keep values in the state: `state[\"k\"] = ...`",
            ),
            ast::Stmt::Assert(_) => self.refuse(
                line,
                "`assert`",
                "asserts vanish under `python -O`, so their meaning is not fixed",
                "`if not COND: raise AssertionError(\"...\")`",
            ),
            ast::Stmt::AnnAssign(_) => self.refuse(
                line,
                "an annotated assignment",
                "a flow has no variables but its state",
                "`state[\"k\"] = ...`",
            ),
            ast::Stmt::FunctionDef(_) | ast::Stmt::AsyncFunctionDef(_) | ast::Stmt::ClassDef(_) => {
                self.refuse(
                    line,
                    "a definition inside the flow",
                    "a flow is pure control flow",
                    "define sub-flows at the top level of the file",
                )
            }
            ast::Stmt::Match(_) => self.refuse(
                line,
                "`match`",
                "not part of the flow language",
                "`if`/`elif`/`else`",
            ),
            _ => self.refuse(
                line,
                "this statement",
                "not part of the flow language",
                "see docs/flows.md for what a flow may contain",
            ),
        }
    }

    fn is_param(&self, e: &ast::Expr) -> bool {
        matches!(e, ast::Expr::Name(n) if n.id.as_str() == self.param())
    }

    fn assign(&mut self, a: &'a ast::StmtAssign, line: u32) {
        let [target] = a.targets.as_slice() else {
            return self.refuse(
                line,
                "an assignment to several targets",
                "only the state or one key of it can be assigned",
                "one assignment per line",
            );
        };
        if self.is_param(target) {
            return self.actor_call(&a.value, line);
        }
        if let ast::Expr::Name(n) = target {
            return self.instance(n.id.as_str(), &a.value, line);
        }
        let Some(path) = self.target(target, line) else {
            return;
        };
        let value = match a.value.as_ref() {
            ast::Expr::Await(aw) => aw.value.as_ref(),
            v => v,
        };
        if let Some(branches) = self.fan_out(value, line) {
            if let Some(branches) = branches {
                self.emit(Instr::FanOut {
                    target: path,
                    branches,
                    line,
                });
            }
            return;
        }
        if matches!(a.value.as_ref(), ast::Expr::Await(_)) {
            return self.refuse(
                line,
                "`await` of something other than an actor call",
                "only actor calls and asyncio.gather are awaited in a flow",
                "`state = await handler(state)`",
            );
        }
        if let Some(value) = self.expr(&a.value, line, None) {
            self.emit(Instr::Set {
                target: path,
                value,
                line,
            });
        }
    }

    /// `model = Model()`: an instance whose methods are handlers (`Model.method`).
    fn instance(&mut self, name: &str, value: &ast::Expr, line: u32) {
        match value {
            ast::Expr::Call(c) if c.args.is_empty() && c.keywords.is_empty() => {
                if let Some(class) = dotted(&c.func) {
                    self.instances.insert(name.to_string(), class);
                    return;
                }
            }
            ast::Expr::Call(_) => {
                return self.refuse(
                    line,
                    "an instantiation with arguments",
                    "the handler's class is instantiated by its runtime, without arguments",
                    "`model = Model()` and give the class default arguments",
                );
            }
            _ => {}
        }
        self.refuse(
            line,
            &format!("an assignment to `{name}`"),
            "a flow has no variables but its state",
            &format!(
                "keep values in the state: `{}[\"{name}\"] = ...`",
                self.param()
            ),
        )
    }

    /// `state = await f(state)`: an actor call or an inlined sub-flow.
    fn actor_call(&mut self, value: &'a ast::Expr, line: u32) {
        let call = match value {
            ast::Expr::Await(a) => a.value.as_ref(),
            v => v,
        };
        let ast::Expr::Call(c) = call else {
            return self.refuse(
                line,
                "an assignment to the state itself",
                "the state is replaced only by an actor's answer",
                "assign keys: `state[\"k\"] = ...`, or call an actor: `state = await h(state)`",
            );
        };
        let one_state_arg = c.keywords.is_empty() && c.args.len() == 1 && self.is_param(&c.args[0]);
        if !one_state_arg {
            return self.refuse(
                line,
                "an actor call with other arguments",
                "an actor receives the whole state and answers the new state",
                &format!("`{0} = await handler({0})`", self.param()),
            );
        }
        if let ast::Expr::Name(n) = c.func.as_ref()
            && let Some(sub) = self.funcs.iter().find(|f| f.name == n.id.as_str())
        {
            return self.sub_flow(sub, line);
        }
        match self.actor_ref(&c.func) {
            Some(a) => {
                self.emit(Instr::Call {
                    actor: a.actor,
                    line,
                });
            }
            None => self.refuse(
                line,
                "this call",
                "an actor is named by a function, `module.function` or `instance.method`",
                "`state = await handler(state)`",
            ),
        }
    }

    fn sub_flow(&mut self, sub: &Func<'a>, line: u32) {
        if self.frames.iter().any(|f| f.name == sub.name) {
            return self.refuse(
                line,
                &format!("the recursive call of sub-flow {}", sub.name),
                "a flow is a bounded program",
                "a `while` loop",
            );
        }
        if sub.param.is_none() {
            return self.refuse(
                line,
                &format!("the sub-flow {}", sub.name),
                "a sub-flow takes exactly one parameter, the state",
                &format!("`async def {}(state: dict) -> dict:`", sub.name),
            );
        }
        self.function(sub, false);
    }

    /// The actor a call's function names, registered; `None` if it names none.
    fn actor_ref(&mut self, func: &ast::Expr) -> Option<ActorRef> {
        let handler = match func {
            ast::Expr::Name(n) => format!("{}.{}", self.opts.module, n.id),
            ast::Expr::Attribute(a) => {
                let base = dotted(&a.value)?;
                match self.instances.get(&base) {
                    Some(class) => format!("{}.{class}.{}", self.opts.module, a.attr),
                    None => format!("{base}.{}", a.attr),
                }
            }
            _ => return None,
        };
        let short = handler
            .strip_prefix(&format!("{}.", self.opts.module))
            .unwrap_or(&handler);
        let actor = dns_label(short)?;
        let r = ActorRef { actor, handler };
        if !self.actors.iter().any(|x| x.actor == r.actor) {
            self.actors.push(r.clone());
        }
        Some(r)
    }

    fn aug_assign(&mut self, a: &ast::StmtAugAssign, line: u32) {
        let Some(path) = self.target(&a.target, line) else {
            return;
        };
        let Some(op) = self.binop(&a.op, line) else {
            return;
        };
        let Some(rhs) = self.expr(&a.value, line, None) else {
            return;
        };
        let current = path.iter().fold(Expr::State, |e, k| {
            Expr::Index(Box::new(e), Box::new(k.clone()))
        });
        self.emit(Instr::Set {
            target: path,
            value: Expr::Bin(op, Box::new(current), Box::new(rhs)),
            line,
        });
    }

    /// `state[k1][k2]` as the keys from the state; `None` (refused) for anything else.
    fn target(&mut self, t: &ast::Expr, line: u32) -> Option<Vec<Expr>> {
        let mut keys = Vec::new();
        let mut at = t;
        while let ast::Expr::Subscript(s) = at {
            if matches!(s.slice.as_ref(), ast::Expr::Slice(_)) {
                self.refuse(
                    line,
                    "a slice assignment",
                    "a mutation sets one key or index",
                    "set the keys one by one, or build the list in a handler",
                );
                return None;
            }
            keys.push(self.expr(&s.slice, line, None)?);
            at = &s.value;
        }
        if !self.is_param(at) || keys.is_empty() {
            self.refuse(
                line,
                "this assignment target",
                "a flow changes only keys of its state",
                &format!("`{}[\"key\"] = ...`", self.param()),
            );
            return None;
        }
        keys.reverse();
        Some(keys)
    }

    /// A fan-out on the right of `state[k] = ...`: `Some(None)` when it is one but refused.
    fn fan_out(&mut self, v: &ast::Expr, line: u32) -> Option<Option<FanOutBranches>> {
        match v {
            ast::Expr::List(l) if l.elts.iter().any(|e| self.is_actor_call(e)) => {
                Some(self.calls(&l.elts, line))
            }
            ast::Expr::ListComp(lc) if self.is_actor_call(&lc.elt) => Some(self.each(lc, line)),
            ast::Expr::Call(c) if is_gather(&c.func) => {
                if !c.keywords.is_empty() {
                    self.refuse(
                        line,
                        "asyncio.gather with keywords",
                        "a fan-out's failures follow the flow's try/except",
                        "asyncio.gather(a(x), b(y)) without return_exceptions",
                    );
                    return Some(None);
                }
                match c.args.as_slice() {
                    [ast::Expr::Starred(s)] => match s.value.as_ref() {
                        ast::Expr::ListComp(lc) if self.is_actor_call(&lc.elt) => {
                            Some(self.each(lc, line))
                        }
                        _ => {
                            self.refuse(
                                line,
                                "this asyncio.gather argument",
                                "a fan-out's branches are actor calls",
                                "asyncio.gather(*[handler(x) for x in state[\"items\"]])",
                            );
                            Some(None)
                        }
                    },
                    args => Some(self.calls(args, line)),
                }
            }
            _ => None,
        }
    }

    /// Whether `e` calls an actor (not a builtin, a method of a value, or asyncio).
    fn is_actor_call(&self, e: &ast::Expr) -> bool {
        let e = match e {
            ast::Expr::Await(a) => a.value.as_ref(),
            e => e,
        };
        let ast::Expr::Call(c) = e else {
            return false;
        };
        match c.func.as_ref() {
            ast::Expr::Name(n) => Builtin::from_name(n.id.as_str()).is_none(),
            ast::Expr::Attribute(a) => {
                Method::from_name(a.attr.as_str()).is_none() && !self.is_param(&a.value)
            }
            _ => false,
        }
    }

    fn calls(&mut self, elts: &[ast::Expr], line: u32) -> Option<FanOutBranches> {
        let mut out = Vec::new();
        for e in elts {
            let e = match e {
                ast::Expr::Await(a) => a.value.as_ref(),
                e => e,
            };
            let (actor, input) = self.branch(e, line, None)?;
            out.push(BranchCall { actor, input });
        }
        Some(FanOutBranches::Calls(out))
    }

    fn each(&mut self, lc: &ast::ExprListComp, line: u32) -> Option<FanOutBranches> {
        let [g] = lc.generators.as_slice() else {
            self.refuse(
                line,
                "a nested comprehension",
                "a fan-out iterates one list",
                "build the list in a handler, then fan out over it",
            );
            return None;
        };
        if !g.ifs.is_empty() || g.is_async {
            self.refuse(
                line,
                "a filtered comprehension",
                "a fan-out sends one branch per item",
                "filter the list in a handler first",
            );
            return None;
        }
        let ast::Expr::Name(var) = &g.target else {
            self.refuse(
                line,
                "this comprehension target",
                "a fan-out binds one name per item",
                "`[handler(x) for x in state[\"items\"]]`",
            );
            return None;
        };
        let items = self.expr(&g.iter, line, None)?;
        let elt = match lc.elt.as_ref() {
            ast::Expr::Await(a) => a.value.as_ref(),
            e => e,
        };
        let (actor, input) = self.branch(elt, line, Some(var.id.as_str()))?;
        Some(FanOutBranches::Each {
            actor,
            var: var.id.to_string(),
            items,
            input,
        })
    }

    fn branch(&mut self, e: &ast::Expr, line: u32, var: Option<&str>) -> Option<(String, Expr)> {
        let ast::Expr::Call(c) = e else {
            self.refuse(
                line,
                "a fan-out item that is not an actor call",
                "each branch of a fan-out is one actor call",
                "`[a(state[\"x\"]), b(state[\"y\"])]`",
            );
            return None;
        };
        if c.args.len() != 1 || !c.keywords.is_empty() {
            self.refuse(
                line,
                "a fan-out call with several arguments",
                "each branch receives one payload",
                "`handler(state[\"x\"])`",
            );
            return None;
        }
        let Some(a) = self.actor_ref(&c.func) else {
            self.refuse(
                line,
                "this fan-out call",
                "an actor is named by a function or `module.function`",
                "`handler(state[\"x\"])`",
            );
            return None;
        };
        let input = self.expr(&c.args[0], line, var)?;
        Some((a.actor, input))
    }

    fn if_(&mut self, i: &'a ast::StmtIf, line: u32) {
        let Some(cond) = self.expr(&i.test, line, None) else {
            return;
        };
        let branch = self.emit(Instr::Branch {
            cond,
            else_to: 0,
            line,
            looping: false,
        });
        self.block(&i.body);
        if i.orelse.is_empty() {
            let end = self.code.len();
            self.patch_else(branch, end);
            return;
        }
        let jump = self.emit(Instr::Jump { to: 0 });
        let else_at = self.code.len();
        self.patch_else(branch, else_at);
        self.block(&i.orelse);
        let end = self.code.len();
        self.code[jump] = Instr::Jump { to: end };
    }

    fn patch_else(&mut self, at: usize, to: usize) {
        if let Instr::Branch { else_to, .. } = &mut self.code[at] {
            *else_to = to;
        }
    }

    fn while_(&mut self, w: &'a ast::StmtWhile, line: u32) {
        if !w.orelse.is_empty() {
            return self.refuse(
                line,
                "`while` ... `else`",
                "its meaning (run when the loop did not break) is easy to misread",
                "set a key in the state before `break` and test it after the loop",
            );
        }
        let always =
            matches!(w.test.as_ref(), ast::Expr::Constant(c) if c.value == Constant::Bool(true));
        let cond = if always {
            None
        } else {
            match self.expr(&w.test, line, None) {
                Some(c) => Some(c),
                None => return,
            }
        };
        let id = self.next_loop;
        self.next_loop += 1;
        self.emit(Instr::LoopEnter { id });
        let top = self.emit(Instr::LoopGuard { id, line });
        let branch = cond.map(|cond| {
            self.emit(Instr::Branch {
                cond,
                else_to: 0,
                line,
                looping: true,
            })
        });
        self.regions.push(Region::Loop);
        self.loops.push(LoopCtx {
            top,
            breaks: Vec::new(),
            depth: self.regions.len(),
        });
        self.block(&w.body);
        self.emit(Instr::Jump { to: top });
        self.regions.pop();
        let end = self.code.len();
        if let Some(ctx) = self.loops.pop() {
            for b in ctx.breaks {
                self.code[b] = Instr::Jump { to: end };
            }
        }
        if let Some(b) = branch {
            self.patch_else(b, end);
        }
    }

    /// Closes the regions above `depth`, innermost first, for a jump out of them.
    fn unwind(&mut self, depth: usize) {
        let exits: Vec<Instr> = self.regions[depth..]
            .iter()
            .rev()
            .filter_map(|r| match r {
                Region::Try => Some(Instr::TryExit),
                Region::Except => Some(Instr::ExceptExit),
                Region::Loop => None,
            })
            .collect();
        for i in exits {
            self.emit(i);
        }
    }

    fn current_loop(&mut self, what: &str, line: u32) -> Option<(usize, usize)> {
        let floor = self.frames.last().map(|f| f.loops).unwrap_or(0);
        match self.loops.last() {
            Some(l) if self.loops.len() > floor => Some((l.top, l.depth)),
            _ => {
                self.refuse(
                    line,
                    &format!("`{what}` outside a loop"),
                    "it has no loop to leave",
                    "use it inside `while`",
                );
                None
            }
        }
    }

    fn break_(&mut self, line: u32) {
        if let Some((_, depth)) = self.current_loop("break", line) {
            self.unwind(depth);
            let at = self.emit(Instr::Jump { to: 0 });
            if let Some(l) = self.loops.last_mut() {
                l.breaks.push(at);
            }
        }
    }

    fn continue_(&mut self, line: u32) {
        if let Some((top, depth)) = self.current_loop("continue", line) {
            self.unwind(depth);
            self.emit(Instr::Jump { to: top });
        }
    }

    fn return_(&mut self, r: &ast::StmtReturn, line: u32) {
        let param = self.param();
        let ok = r.value.as_deref().is_some_and(|v| self.is_param(v));
        if !ok {
            return self.refuse(
                line,
                "this `return`",
                "a flow returns its state",
                &format!("`return {param}`"),
            );
        }
        let Some(frame) = self.frames.last() else {
            return;
        };
        if frame.top {
            self.emit(Instr::Return { line });
            return;
        }
        let depth = frame.depth;
        self.unwind(depth);
        let at = self.emit(Instr::Jump { to: 0 });
        if let Some(f) = self.frames.last_mut() {
            f.returns.push(at);
        }
    }

    fn try_(&mut self, t: &'a ast::StmtTry, line: u32) {
        if !t.finalbody.is_empty() {
            return self.refuse(
                line,
                "`finally`",
                "a finally body would have to run on every way out, including the x-sump one",
                "put its statements after the try and at the end of each except",
            );
        }
        let enter = self.emit(Instr::TryEnter {
            handlers: Vec::new(),
            line,
        });
        self.regions.push(Region::Try);
        self.block(&t.body);
        self.regions.pop();
        self.emit(Instr::TryExit);
        self.block(&t.orelse);
        let mut ends = vec![self.emit(Instr::Jump { to: 0 })];
        let mut handlers = Vec::new();
        for h in &t.handlers {
            let ast::ExceptHandler::ExceptHandler(h) = h;
            let hline = self.lines.at(h);
            if h.name.is_some() {
                self.refuse(
                    hline,
                    "`except ... as NAME`",
                    "a flow has no variables but its state",
                    "`except ValueError:` (the error's type and message are in x-asya-attempts)",
                );
                continue;
            }
            let types = match h.type_.as_deref() {
                None => None,
                Some(e) => match exception_names(e) {
                    Some(names) => Some(names),
                    None => {
                        self.refuse(
                            hline,
                            "this `except` clause",
                            "an except names exception classes",
                            "`except ValueError:` or `except (KeyError, ValueError):`",
                        );
                        continue;
                    }
                },
            };
            handlers.push(Handler {
                types,
                to: self.code.len(),
                line: hline,
            });
            self.regions.push(Region::Except);
            self.block(&h.body);
            self.regions.pop();
            self.emit(Instr::ExceptExit);
            ends.push(self.emit(Instr::Jump { to: 0 }));
        }
        let end = self.code.len();
        for at in ends {
            self.code[at] = Instr::Jump { to: end };
        }
        if let Instr::TryEnter { handlers: h, .. } = &mut self.code[enter] {
            *h = handlers;
        }
    }

    fn raise(&mut self, r: &ast::StmtRaise, line: u32) {
        if r.cause.is_some() {
            return self.refuse(
                line,
                "`raise ... from ...`",
                "a flow's errors carry a type and a message",
                "`raise ValueError(\"message\")`",
            );
        }
        let Some(exc) = r.exc.as_deref() else {
            if !self.regions.contains(&Region::Except) {
                return self.refuse(
                    line,
                    "a bare `raise` outside `except`",
                    "there is no error to re-raise",
                    "`raise ValueError(\"message\")`",
                );
            }
            self.emit(Instr::Raise { new: None, line });
            return;
        };
        let (name, message) = match exc {
            ast::Expr::Name(n) => (n.id.to_string(), String::new()),
            ast::Expr::Call(c) if c.keywords.is_empty() => {
                match (c.func.as_ref(), c.args.as_slice()) {
                    (ast::Expr::Name(n), []) => (n.id.to_string(), String::new()),
                    (ast::Expr::Name(n), [ast::Expr::Constant(k)]) => match &k.value {
                        Constant::Str(s) => (n.id.to_string(), s.clone()),
                        _ => return self.raise_refused(line),
                    },
                    _ => return self.raise_refused(line),
                }
            }
            _ => return self.raise_refused(line),
        };
        self.emit(Instr::Raise {
            new: Some(NewError {
                error_type: name,
                message,
            }),
            line,
        });
    }

    fn raise_refused(&mut self, line: u32) {
        self.refuse(
            line,
            "this `raise`",
            "a flow raises a class with a constant message",
            "`raise ValueError(\"message\")` or a bare `raise` inside `except`",
        )
    }

    fn binop(&mut self, op: &ast::Operator, line: u32) -> Option<BinOp> {
        Some(match op {
            ast::Operator::Add => BinOp::Add,
            ast::Operator::Sub => BinOp::Sub,
            ast::Operator::Mult => BinOp::Mul,
            ast::Operator::Div => BinOp::Div,
            ast::Operator::FloorDiv => BinOp::FloorDiv,
            ast::Operator::Mod => BinOp::Mod,
            other => {
                self.refuse(
                    line,
                    &format!("the operator {other:?}"),
                    "flow expressions have + - * / // %",
                    USE_HANDLER,
                );
                return None;
            }
        })
    }

    /// A bounded expression; `var` is a comprehension's variable.
    fn expr(&mut self, e: &ast::Expr, line: u32, var: Option<&str>) -> Option<Expr> {
        let sub = |c: &mut Self, x: &ast::Expr| c.expr(x, line, var).map(Box::new);
        Some(match e {
            ast::Expr::Name(n) if n.id.as_str() == self.param() => Expr::State,
            ast::Expr::Name(n) if Some(n.id.as_str()) == var => Expr::Var(n.id.to_string()),
            ast::Expr::Name(n) => {
                self.refuse(
                    line,
                    &format!("the name `{}`", n.id),
                    "a flow expression sees only its state",
                    &format!("read it from the state: `{}[\"{}\"]`", self.param(), n.id),
                );
                return None;
            }
            ast::Expr::Constant(c) => Expr::Const(self.constant(&c.value, line)?),
            ast::Expr::Subscript(s) => {
                if matches!(s.slice.as_ref(), ast::Expr::Slice(_)) {
                    self.refuse(
                        line,
                        "a slice",
                        "flow expressions index one key or position",
                        USE_HANDLER,
                    );
                    return None;
                }
                Expr::Index(sub(self, &s.value)?, sub(self, &s.slice)?)
            }
            ast::Expr::BoolOp(b) => {
                let xs = b
                    .values
                    .iter()
                    .map(|x| self.expr(x, line, var))
                    .collect::<Option<Vec<_>>>()?;
                match b.op {
                    ast::BoolOp::And => Expr::And(xs),
                    ast::BoolOp::Or => Expr::Or(xs),
                }
            }
            ast::Expr::UnaryOp(u) => match u.op {
                ast::UnaryOp::Not => Expr::Not(sub(self, &u.operand)?),
                ast::UnaryOp::USub => Expr::Neg(sub(self, &u.operand)?),
                ast::UnaryOp::UAdd => Expr::Bin(
                    BinOp::Add,
                    Box::new(Expr::Const(json!(0))),
                    sub(self, &u.operand)?,
                ),
                ast::UnaryOp::Invert => {
                    self.refuse(
                        line,
                        "the operator ~",
                        "flow expressions have no bit operations",
                        USE_HANDLER,
                    );
                    return None;
                }
            },
            ast::Expr::BinOp(b) => {
                let op = self.binop(&b.op, line)?;
                Expr::Bin(op, sub(self, &b.left)?, sub(self, &b.right)?)
            }
            ast::Expr::Compare(c) => {
                let left = sub(self, &c.left)?;
                let mut ops = Vec::new();
                for (op, r) in c.ops.iter().zip(&c.comparators) {
                    let op = match op {
                        ast::CmpOp::Eq => CmpOp::Eq,
                        ast::CmpOp::NotEq => CmpOp::NotEq,
                        ast::CmpOp::Lt => CmpOp::Lt,
                        ast::CmpOp::LtE => CmpOp::LtE,
                        ast::CmpOp::Gt => CmpOp::Gt,
                        ast::CmpOp::GtE => CmpOp::GtE,
                        ast::CmpOp::In => CmpOp::In,
                        ast::CmpOp::NotIn => CmpOp::NotIn,
                        ast::CmpOp::Is | ast::CmpOp::IsNot => {
                            let is_singleton = matches!(r, ast::Expr::Constant(k)
                                if matches!(k.value, Constant::None | Constant::Bool(_)));
                            if !is_singleton {
                                self.refuse(
                                    line,
                                    "`is` with a value other than None, True or False",
                                    "JSON values have no identity",
                                    "`==`",
                                );
                                return None;
                            }
                            if matches!(op, ast::CmpOp::Is) {
                                CmpOp::Is
                            } else {
                                CmpOp::IsNot
                            }
                        }
                    };
                    ops.push((op, self.expr(r, line, var)?));
                }
                Expr::Compare { left, ops }
            }
            ast::Expr::IfExp(i) => Expr::IfElse(
                sub(self, &i.test)?,
                sub(self, &i.body)?,
                sub(self, &i.orelse)?,
            ),
            ast::Expr::List(l) => Expr::List(
                l.elts
                    .iter()
                    .map(|x| self.expr(x, line, var))
                    .collect::<Option<Vec<_>>>()?,
            ),
            ast::Expr::Dict(d) => {
                let mut kvs = Vec::new();
                for (k, v) in d.keys.iter().zip(&d.values) {
                    let Some(k) = k else {
                        self.refuse(
                            line,
                            "`**` in a dict",
                            "flow dicts list their keys",
                            "write the keys out",
                        );
                        return None;
                    };
                    kvs.push((self.expr(k, line, var)?, self.expr(v, line, var)?));
                }
                Expr::Dict(kvs)
            }
            ast::Expr::Call(c) => return self.call_expr(c, line, var),
            ast::Expr::Await(_) => {
                self.refuse(
                    line,
                    "an actor call inside an expression",
                    "an actor's answer replaces the whole state",
                    "call it on its own line: `state = await handler(state)`, then read the key",
                );
                return None;
            }
            ast::Expr::JoinedStr(_) => {
                self.refuse(
                    line,
                    "an f-string",
                    "flow expressions build strings with + and str()",
                    "`\"n=\" + str(state[\"n\"])`",
                );
                return None;
            }
            ast::Expr::Tuple(_) => {
                self.refuse(
                    line,
                    "a tuple",
                    "the state is JSON, which has lists",
                    "a list `[a, b]`",
                );
                return None;
            }
            ast::Expr::Lambda(_)
            | ast::Expr::NamedExpr(_)
            | ast::Expr::ListComp(_)
            | ast::Expr::SetComp(_)
            | ast::Expr::DictComp(_)
            | ast::Expr::GeneratorExp(_)
            | ast::Expr::Set(_)
            | ast::Expr::Attribute(_)
            | ast::Expr::Starred(_)
            | ast::Expr::Yield(_)
            | ast::Expr::YieldFrom(_)
            | ast::Expr::Slice(_)
            | ast::Expr::FormattedValue(_) => {
                self.refuse(
                    line,
                    &format!("this expression ({})", expr_kind(e)),
                    "a flow's expressions are a bounded subset: keys, constants, comparisons, \
                     and/or/not, + - * / // %, if-else, lists, dicts and a few builtins",
                    USE_HANDLER,
                );
                return None;
            }
        })
    }

    fn call_expr(&mut self, c: &ast::ExprCall, line: u32, var: Option<&str>) -> Option<Expr> {
        if !c.keywords.is_empty() {
            self.refuse(
                line,
                "a call with keyword arguments",
                "flow builtins take positional arguments",
                USE_HANDLER,
            );
            return None;
        }
        let args = c
            .args
            .iter()
            .map(|x| self.expr(x, line, var))
            .collect::<Option<Vec<_>>>()?;
        match c.func.as_ref() {
            ast::Expr::Name(n) => {
                match Builtin::from_name(n.id.as_str()) {
                    Some(b) => Some(Expr::Builtin(b, args)),
                    None => {
                        self.refuse(
                        line,
                        &format!("the call `{}(...)` inside an expression", n.id),
                        &format!("a flow expression calls only {}; actor calls stand on their own line", Builtin::NAMES),
                        "`state = await handler(state)` on its own line",
                    );
                        None
                    }
                }
            }
            ast::Expr::Attribute(a) => match Method::from_name(a.attr.as_str()) {
                Some(m) => {
                    let of = self.expr(&a.value, line, var)?;
                    Some(Expr::Method(Box::new(of), m, args))
                }
                None => {
                    self.refuse(
                        line,
                        &format!("the method `.{}()`", a.attr),
                        &format!("flow expressions call only the methods {}", Method::NAMES),
                        USE_HANDLER,
                    );
                    None
                }
            },
            _ => {
                self.refuse(
                    line,
                    "this call",
                    "not part of the flow language",
                    USE_HANDLER,
                );
                None
            }
        }
    }

    fn constant(&mut self, c: &Constant, line: u32) -> Option<Value> {
        Some(match c {
            Constant::None => Value::Null,
            Constant::Bool(b) => Value::Bool(*b),
            Constant::Str(s) => Value::String(s.clone()),
            Constant::Int(i) => match i.to_string().parse::<i64>() {
                Ok(i) => Value::from(i),
                Err(_) => {
                    self.refuse(
                        line,
                        "this integer",
                        "flow integers are 64-bit",
                        "a smaller number, or a string",
                    );
                    return None;
                }
            },
            Constant::Float(f) => match serde_json::Number::from_f64(*f) {
                Some(n) => Value::Number(n),
                None => {
                    self.refuse(
                        line,
                        "this float",
                        "JSON has no inf or nan",
                        "a finite number",
                    );
                    return None;
                }
            },
            _ => {
                self.refuse(
                    line,
                    "this constant (bytes, complex, tuple or ...)",
                    "the state is JSON",
                    "a string, number, bool, None, list or dict",
                );
                return None;
            }
        })
    }
}

fn expr_kind(e: &ast::Expr) -> &'static str {
    match e {
        ast::Expr::Lambda(_) => "lambda",
        ast::Expr::NamedExpr(_) => ":=",
        ast::Expr::ListComp(_) => "a comprehension outside a fan-out",
        ast::Expr::SetComp(_) | ast::Expr::Set(_) => "a set",
        ast::Expr::DictComp(_) => "a dict comprehension",
        ast::Expr::GeneratorExp(_) => "a generator",
        ast::Expr::Attribute(_) => "an attribute",
        ast::Expr::Starred(_) => "*",
        _ => "unsupported",
    }
}

/// `asyncio.gather` (or a bare `gather` imported from asyncio).
fn is_gather(f: &ast::Expr) -> bool {
    match f {
        ast::Expr::Attribute(a) => {
            a.attr.as_str() == "gather"
                && matches!(a.value.as_ref(), ast::Expr::Name(n) if n.id.as_str() == "asyncio")
        }
        ast::Expr::Name(n) => n.id.as_str() == "gather",
        _ => false,
    }
}

/// `a.b.c` as text.
fn dotted(e: &ast::Expr) -> Option<String> {
    match e {
        ast::Expr::Name(n) => Some(n.id.to_string()),
        ast::Expr::Attribute(a) => Some(format!("{}.{}", dotted(&a.value)?, a.attr)),
        _ => None,
    }
}

/// The exception class names of an `except` clause.
fn exception_names(e: &ast::Expr) -> Option<Vec<String>> {
    match e {
        ast::Expr::Name(n) => Some(vec![n.id.to_string()]),
        // `module.Error`: Python matches the class, whose __name__ is the last part.
        ast::Expr::Attribute(a) => Some(vec![a.attr.to_string()]),
        ast::Expr::Tuple(t) => t
            .elts
            .iter()
            .map(|x| exception_names(x).map(|mut v| v.remove(0)))
            .collect(),
        _ => None,
    }
}

/// An actor name (a DNS label) from a handler's short name: `analyze_sentiment` →
/// `analyze-sentiment`, `Model.predict` → `model-predict`.
pub fn dns_label(name: &str) -> Option<String> {
    let mut out = String::new();
    for ch in name.chars() {
        match ch {
            'a'..='z' | '0'..='9' => out.push(ch),
            'A'..='Z' => out.push(ch.to_ascii_lowercase()),
            '_' | '.' | '-' if !out.is_empty() && !out.ends_with('-') => out.push('-'),
            '_' | '.' | '-' => {}
            _ => return None,
        }
    }
    let out = out.trim_end_matches('-').to_string();
    (!out.is_empty() && out.len() <= 63).then_some(out)
}
