"""The graded test process: runs pytest on the patched tree and reports outcomes the tested code cannot forge.

This file is never imported by agentgym: the grading driver (:func:`agentgym.tasks.swe.workspace.grade_code`)
starts ``python -I -B -c <this file's text>`` in the grading sandbox. The graded library modules run inside this
process (the tests call them), so this process is the one place where the attacker's code and the grader meet.

What the tested code cannot do here, and why:

* **Forge the report.** Outcomes go to a descriptor the driver reads, as one line authenticated with
  HMAC-SHA256 (RFC 2104) under a key read from stdin before any library code is imported. The key exists only
  as two pre-keyed C hash objects in the closure of an audit hook (PEP 578). An audit hook cannot be removed
  or listed from Python, and CPython runs it with tracing and profiling off. The hook calls only functions it
  bound before the tested code could run (builtins and ``os`` functions are closure variables, the tested
  code's objects are only type-checked, a static test checks it looks up no global), never raises, and so
  never exposes its frame. No code of the tested library can run inside the hook either: pytest, and with
  it all tested code, runs in a worker thread, where CPython never runs Python signal handlers and
  ``signal.signal`` is refused (the main thread only waits in C); automatic GC, whose finalizers could run
  there, is off while the hook runs; a frame requested from inside the hook ends the run. Its function,
  cells and state sit in the permanent GC generation (``gc.freeze``), which ``gc.get_objects`` and
  ``gc.get_referrers`` do not walk; a GC query after ``gc.unfreeze`` ends the run. ``__main__`` holds only the
  boot function, whose frame holds neither the key nor the hook.
* **Report a pass for a test whose body did not run, or raised.** A test counts as passed only if pytest
  reported it passed *and* the hook saw the genuine test function return normally, called from this file's
  own ``pytest_pyfunc_call`` (or ``unittest.TestCase._callTestMethod``). "Genuine" means its code object
  equals (``==``: same bytecode, constants, names) code this process compiled from the pristine test files,
  with and without pytest's assertion rewriting, before any library code ran, and its name is the test id's;
  a test method's class (and metaclass) may hold no untrusted callable under the name of a unittest or
  pristine-test method (a subclass whose ``assertEqual`` does nothing is refused). A decorator's wrapper
  (freezegun's ``freeze_time``) is followed to the test it wraps only if the wrapper's code equals what its
  own installed file compiles to. Skipping test bodies, emptying or swapping ``__code__``, calling another
  test in its place, or patching pytest's runner or reports therefore cannot produce a pass: at worst the test
  fails. While crediting, the hook also checks that the functions of pytest's, pluggy's and unittest's modules
  and classes are the ones present when the session started (``pytest.raises`` patched: no credit).
* **Reach the hook or steer a test frame.** The run ends (the report names the event and nothing counts) on
  ``sys.settrace`` (a tracer can move a test frame past its assertions through ``frame.f_lineno``; the one
  exception is doctest's runner putting back the ``None`` it found), ``sys.setprofile``,
  ``sys._current_frames`` (another thread's view of the hook's frame), ``sys.addaudithook`` (a later hook
  would see the events the guard raises), ``ctypes`` once the session started, a forged ``agentgym.*`` event,
  and the GC case above. The process is non-dumpable (``PR_SET_DUMPABLE``): ``/proc/self/mem`` and
  ``/proc/self/fd`` become root's and closed to it and to its children (proc(5), ptrace(2) access mode
  checks); exec'd children do not inherit the report descriptor.

Costs to honest tests: tests that install signal handlers, trace or profile (``sys.settrace``/``setprofile``),
call ``ctypes`` or are ``async`` cannot pass here; test functions outside the folders of the graded test files
(and their parents) cannot be credited.

Residual risk, stated honestly: code in this process can still (1) return objects that lie to the tests'
assertions (``__eq__`` always true): a weakness of the tests, not of the grader; (2) re-enter pytest with a
mixed-up item (the arguments of a passing parameter set under a failing test's id); (3) rewrite the closure or
globals of a third-party decorator that wraps a test so that it swallows the test's exception; (4) rewrite
the globals of a test module, or a pytest helper between two checks, so the genuine body returns; (5) hide a
subTest failure if it also rewrites that report; (6) from a second thread, keep re-enabling GC so that a
finalizer of its own runs inside the hook on the tests' thread and reads the hook's frame (a race it can
retry); (7) corrupt memory through an interpreter bug. Each needs an attack aimed at this grader; none is the
cheap kind this file is built to stop. The grading driver also re-checks the test files on disk after the run.
"""


def _agentgym_boot() -> None:  # noqa: C901 - one function so that nothing it binds is a module global
    import _thread
    import ast
    import gc
    import hashlib
    import json
    import os
    import sys
    import types

    cfg = json.loads(sys.stdin.buffer.read())
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sys.path[:0] = cfg["path"]
    fd = int(cfg["fd"])
    os.set_inheritable(fd, False)  # an exec'd child must not inherit the report descriptor

    import ctypes

    if ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE = 4
        raise SystemExit("agentgym grader: prctl(PR_SET_DUMPABLE, 0) failed")
    if not isinstance(hashlib.sha256, types.BuiltinFunctionType):
        raise SystemExit("agentgym grader: hashlib.sha256 is not the C implementation")

    import unittest
    import unittest.case

    import pytest
    from _pytest.assertion.rewrite import rewrite_asserts

    refs: dict[tuple[str, str, int], list[types.CodeType]] = {}

    def collect(code: types.CodeType) -> None:
        refs.setdefault((code.co_filename, code.co_qualname, code.co_firstlineno), []).append(code)
        for const in code.co_consts:
            if type(const) is types.CodeType:
                collect(const)

    for path in cfg["reference"]:
        try:
            with open(path, "rb") as fh:
                source = fh.read()
            collect(compile(source, path, "exec", dont_inherit=True))
            tree = ast.parse(source, filename=path)
            rewrite_asserts(tree, source, path, None)
            collect(compile(tree, path, "exec", dont_inherit=True))
        except (OSError, SyntaxError, ValueError):
            continue  # not Python a test can live in; its tests (if any) cannot be credited

    import inspect
    import sysconfig
    import threading

    audit, is_async = sys.audit, inspect.iscoroutinefunction
    roots = {sys.base_prefix, sys.prefix, *(sysconfig.get_paths()[k] for k in ("stdlib", "purelib", "platlib"))}
    roots.update(p for p in cfg["test_path"] if os.path.isabs(p))

    def install(key_hex: str, codes: dict[int, str]) -> None:
        """Add the audit hook. Every name it uses is bound here, before the tested code can rebind anything;
        the key becomes two keyed hash objects only the hook's closure holds (this frame is gone afterwards)."""
        pad = bytes.fromhex(key_hex).ljust(64, b"\0")
        inner = hashlib.sha256(bytes(b ^ 0x36 for b in pad))  # RFC 2104: H((K^opad) || H((K^ipad) || m))
        outer = hashlib.sha256(bytes(b ^ 0x5C for b in pad))
        del pad, key_hex
        _type, _str, _int, _len, _range, _id = type, str, int, len, range, id
        base_exc, value_error, os_error = BaseException, ValueError, OSError
        _list, _set, _bytes, _compile = list, set, bytes, compile
        installed_codes: dict[str, dict[tuple[str, int], types.CodeType]] = {}
        descriptors = (types.FunctionType, classmethod, staticmethod, property)
        object_type, dict_type, _callable, get_attribute = object, dict, callable, object.__getattribute__
        _classmethod, _staticmethod, _property = classmethod, staticmethod, property
        getset_type, _issubclass, heap_type = types.GetSetDescriptorType, issubclass, 1 << 9
        type_slots = type.__dict__
        mro_of, dict_of = type_slots["__mro__"].__get__, type_slots["__dict__"].__get__
        flags_of = type_slots["__flags__"].__get__
        special = frozenset({"__dict__", "__getattribute__", "__getattr__", "__class__"})
        module_type, modules = types.ModuleType, sys.modules
        function_type, method_type, code_type, frame_type = (types.FunctionType, types.MethodType,
                                                               types.CodeType, types.FrameType)
        getframe, ident = sys._getframe, _thread.get_ident
        write, lseek, truncate, exit_ = os.write, os.lseek, os.ftruncate, os._exit
        os_open, os_read, os_close, rdonly = os.open, os.read, os.close, os.O_RDONLY
        freeze_count, gc_enabled, gc_disable, gc_enable = gc.get_freeze_count, gc.isenabled, gc.disable, gc.enable
        guard_codes: set[int] = set()
        own_reads = frozenset({"__code__", "f_code"})  # the audited attributes the guard itself reads
        pytest_module, sys_module = pytest, sys
        repo = cfg["repo"].rstrip("/") + "/"
        trusted_roots = tuple(sorted(r.rstrip("/") + "/" for r in roots))
        stdlib = sysconfig.get_paths()["stdlib"].rstrip("/") + "/"
        deny = frozenset({"sys.setprofile", "sys._current_frames", "sys._current_exceptions",
                          "sys.addaudithook"})
        gc_queries = frozenset({"gc.get_objects", "gc.get_referrers", "gc.get_referents"})
        busy: set[int] = set()
        reported: dict[str, str] = {}
        passed_bodies: set[str] = set()
        callers = dict(codes)  # id(code) -> the one agentgym event that code may raise
        armed = [False]
        snapshot: list[tuple[object, str, object]] = []
        snapshot_classes: set[int] = set()
        missing = object()

        def emit(exit_code: int, violation: str) -> None:
            lines = ["exit " + _str(exit_code)]
            if violation:
                lines.append("violation " + violation)
            for nodeid, outcome in reported.items():
                hexid = nodeid.encode("utf-8", "surrogatepass").hex()
                if outcome == "passed" and nodeid not in passed_bodies:
                    lines.append("tampered " + hexid)
                    outcome = "failed"
                lines.append("outcome " + hexid + " " + outcome)
            payload = "\n".join(lines).encode("utf-8", "surrogatepass")
            digest = inner.copy()
            digest.update(payload)
            tag = outer.copy()
            tag.update(digest.digest())
            data = (tag.hexdigest() + " " + payload.hex() + "\n").encode("ascii")
            lseek(fd, 0, 0)
            truncate(fd, 0)
            while data:
                data = data[write(fd, data):]

        def die(violation: str) -> None:
            try:
                emit(70, violation)
            finally:
                exit_(70)

        def installed(code: object) -> bool:
            """Whether ``code`` is exactly what its own file (an installed one, outside the repo) compiles to: a
            decorator's wrapper may be trusted to call the test it wraps only if nobody rewrote it."""
            if _type(code) is not code_type:
                return False
            filename = code.co_filename
            if _type(filename) is not _str:
                return False
            source = filename
            if filename.startswith("<frozen ") and filename.endswith(">"):  # a stdlib module frozen into python
                source = stdlib + filename[8:-1].replace(".", "/") + ".py"
            elif not filename.startswith(trusted_roots) or filename.startswith(repo):
                return False
            found = installed_codes.get(filename)
            if found is None:
                found = installed_codes[filename] = {}
                try:
                    handle = os_open(source, rdonly)
                except os_error:
                    return False
                try:
                    chunks = []
                    while True:
                        chunk = os_read(handle, 1 << 20)
                        if not chunk:
                            break
                        chunks.append(chunk)
                finally:
                    os_close(handle)
                try:
                    pending = [_compile(_bytes().join(chunks), filename, "exec", 0, True)]
                except base_exc:
                    return False
                while pending:
                    item = pending.pop()
                    found[(item.co_qualname, item.co_firstlineno)] = item
                    for const in item.co_consts:
                        if _type(const) is code_type:
                            pending.append(const)
            ref = found.get((code.co_qualname, code.co_firstlineno))
            return ref is not None and code == ref

        def genuine(code: object) -> bool:
            if _type(code) is not code_type:
                return False
            filename = code.co_filename
            if _type(filename) is not _str or not filename.startswith(repo):
                return False
            for ref in refs.get((filename, code.co_qualname, code.co_firstlineno), ()):
                if code == ref:
                    return True
            return False

        def intact() -> bool:
            for mapping, key, value in snapshot:
                if mapping.get(key, missing) is not value:
                    return False
            return True

        def verify(nodeid: object, fn: object) -> bool:
            """``fn`` is the genuine test named by ``nodeid``, possibly inside decorators from installed code."""
            if _type(nodeid) is not _str:
                return False
            name = nodeid.partition("[")[0].rpartition("::")[2]  # parameter ids may hold "::"
            for _ in _range(8):
                if _type(fn) is method_type:
                    if not honest_instance(fn.__self__, name):
                        return False
                    fn = fn.__func__
                if _type(fn) is not function_type:
                    return False
                code = fn.__code__
                if genuine(code):
                    module = fn.__globals__.get("pytest", pytest_module)
                    return code.co_name == name and module is pytest_module and intact()
                if not installed(code):
                    return False
                wrapped = fn.__dict__.get("__wrapped__")
                if _type(wrapped) is not function_type:
                    wrapped = None
                    for cell in fn.__closure__ or ():
                        try:
                            content = cell.cell_contents
                        except value_error:
                            continue
                        if _type(content) is function_type and genuine(content.__code__):
                            wrapped = content
                fn = wrapped
            return False

        def trusted_function(value: object) -> bool:
            if _type(value) in (_classmethod, _staticmethod):
                value = value.__func__
            elif _type(value) is _property:
                return all_trusted((value.fget, value.fset, value.fdel))
            return _type(value) is function_type and (genuine(value.__code__) or installed(value.__code__))

        def all_trusted(values: tuple) -> bool:
            for value in values:
                if value is not None and not trusted_function(value):
                    return False
            return True

        def honest_class(cls: object, methods: set) -> bool:
            """Along ``cls``'s MRO (read through ``type``'s own C descriptors, so no metaclass code runs), every
            attribute that stands for a method of unittest, of a builtin type or of the pristine tests is the
            trusted one: a subclass whose ``assertEqual`` does nothing is refused. Other callables (a library
            function a test class keeps as an attribute) may not shadow such a name. Their names go in
            ``methods``. unittest's and pytest's own classes are checked by intact()."""
            protected, loose = _set(), []
            for klass in mro_of(cls):
                if klass is object_type or _id(klass) in snapshot_classes or not flags_of(klass) & heap_type:
                    protected.update(dict_of(klass))
                    continue
                for key, value in _list(dict_of(klass).items()):
                    if key in special and _type(value) is not getset_type:
                        return False  # attribute lookups on the instance would run that code
                    if _type(value) in descriptors and trusted_function(value):
                        protected.add(key)
                        methods.add(key)
                    elif _callable(value) or _type(value) in descriptors:
                        if not _issubclass(_type(value), _type):
                            loose.append(key)
                            methods.add(key)
            for key in loose:
                if key in protected:
                    return False
            return True

        def honest_instance(instance: object, name: str) -> bool:
            """The object a test method is bound to: of a class whose methods are all trusted (not a subclass
            whose ``assertEqual`` does nothing), with a trusted metaclass, and no method shadowed per instance."""
            cls, methods = _type(instance), _set()
            if not (honest_class(cls, methods) and honest_class(_type(cls), _set())):
                return False
            try:
                state = get_attribute(instance, "__dict__")
            except base_exc:
                state = None
            if _type(state) is dict_type:
                for key in _list(state):
                    if key != name and key in methods:
                        return False
            return True

        def arm() -> None:
            seen = _set()
            for name, module in _list(modules.items()):
                if _type(name) is not _str or not name.startswith(("pytest", "_pytest", "pluggy", "unittest")):
                    continue
                if _type(module) is not module_type:
                    continue
                namespace = module.__dict__
                for key, value in _list(namespace.items()):
                    if _type(value) is function_type:
                        snapshot.append((namespace, key, value))
                    elif _type(value) is _type and _id(value) not in seen:
                        seen.add(_id(value))
                        snapshot_classes.add(_id(value))
                        for attr, member in _list(value.__dict__.items()):
                            if _type(member) in descriptors:
                                snapshot.append((value.__dict__, attr, member))
            armed[0] = True

        def handle(event: str, args: tuple) -> None:
            if event == "sys.settrace":
                # doctest's runner puts back the trace function it found, which can only be None here: allowed
                # when it is really doctest's code, with the real ``sys``, restoring None. Any other tracer could
                # jump a test's frame past its assertions (frame.f_lineno), so it ends the run.
                caller = getframe(2)
                if not (caller.f_code.co_qualname == "DocTestRunner.run" and installed(caller.f_code)
                        and caller.f_globals.get("sys") is sys_module
                        and caller.f_locals.get("save_trace", missing) is None):
                    die(event)
            elif event in deny or (armed[0] and event.startswith("ctypes.")):
                die(event)
            elif event in gc_queries:
                if freeze_count() == 0:
                    die(event + " after gc.unfreeze")
            elif event.startswith("agentgym."):
                caller = getframe(2).f_code  # 0 handle, 1 guard, 2 whoever called sys.audit
                if callers.get(_id(caller)) != event:
                    die("agentgym event from foreign code: " + event)
                if event == "agentgym.ok":
                    if _len(args) == 2 and verify(args[0], args[1]):
                        passed_bodies.add(args[0])
                elif event == "agentgym.report":
                    nodeid, when, outcome = args
                    if _type(nodeid) is _str and _type(when) is _str and _type(outcome) is _str:
                        if when == "call" or outcome != "passed":
                            if reported.get(nodeid) in ("failed", "error"):
                                return
                            if when != "call":
                                outcome = "error" if outcome == "failed" else outcome
                            reported[nodeid] = outcome
                elif event == "agentgym.collect_error":
                    if _type(args[0]) is _str:
                        reported[args[0]] = "error"
                elif event == "agentgym.arm":
                    arm()
                elif event == "agentgym.finish":
                    code = args[0] if _type(args[0]) is _int else -1
                    emit(code, "")
                    exit_(0)

        def nested(event: str, args: tuple) -> None:
            """An event raised while this thread is in the guard: its own attribute reads, file reads and frame
            lookup are expected; a frame reached from inside the guard is not (only code the guard did not
            call could ask for one), so it ends the run."""
            if event == "sys._getframe":
                frame = args[0] if _len(args) else None
                while _type(frame) is frame_type:
                    if _id(frame.f_code) in guard_codes:
                        die("a frame of the grader's hook was requested")
                    frame = frame.f_back
            elif event == "object.__getattr__" and (_len(args) < 2 or args[1] not in own_reads):
                die("frame access inside the grader's hook")

        def guard(event: str, args: tuple) -> None:
            enabled = gc_enabled()
            gc_disable()  # first: no collection, hence no finalizer of the tested code, runs inside the guard
            me = ident()
            try:
                if me in busy:
                    nested(event, args)
                    return
                busy.add(me)
                try:
                    handle(event, args)
                finally:
                    busy.discard(me)
            except base_exc:
                die("grader error on " + event)
            finally:
                if enabled:
                    gc_enable()

        guard_codes.update(_id(f.__code__) for f in (guard, nested, handle, emit, die, verify, genuine, installed,
                                                      honest_class, honest_instance, trusted_function, all_trusted,
                                                      intact, arm))

        sys.addaudithook(guard)

    class Recorder:
        """Forwards pytest's facts to the audit hook; holds nothing an attacker could use."""

        @pytest.hookimpl(tryfirst=True)
        def pytest_pyfunc_call(self, pyfuncitem):  # noqa: ANN001, ANN201 - pytest hook signature
            fn = pyfuncitem.obj
            if is_async(fn):
                return None  # pytest's own hook fails it; no genuine return is recorded
            args = {arg: pyfuncitem.funcargs[arg] for arg in pyfuncitem._fixtureinfo.argnames}
            nodeid = pyfuncitem.nodeid  # read before the body: nothing of the tested code runs between its end and the hook
            fn(**args)
            audit("agentgym.ok", nodeid, fn)
            return True

        def pytest_runtest_logreport(self, report):  # noqa: ANN001, ANN201
            audit("agentgym.report", report.nodeid, report.when, report.outcome)

        def pytest_collectreport(self, report):  # noqa: ANN001, ANN201
            if report.failed:
                audit("agentgym.collect_error", report.nodeid or "<collection>")

        @pytest.hookimpl(trylast=True)
        def pytest_sessionstart(self, session):  # noqa: ANN001, ANN201
            audit("agentgym.arm")

    def call_test_method(self, method):  # noqa: ANN001, ANN202 - replaces unittest's TestCase._callTestMethod
        nodeid = getattr(getattr(getattr(self, "_outcome", None), "result", None), "nodeid", None)
        method()
        if nodeid is not None:  # None: a TestCase run by a test itself, not an item pytest collected
            audit("agentgym.ok", nodeid, method)

    unittest.case.TestCase._callTestMethod = call_test_method
    callers = {id(function.__code__): event for event, function in (
        ("agentgym.ok", Recorder.pytest_pyfunc_call), ("agentgym.ok", call_test_method),
        ("agentgym.report", Recorder.pytest_runtest_logreport),
        ("agentgym.collect_error", Recorder.pytest_collectreport),
        ("agentgym.arm", Recorder.pytest_sessionstart))}
    # pytest, and so all tested code, runs in a second thread. CPython runs Python-level signal handlers only
    # in the main thread, and only the main thread may install one (signal.signal raises elsewhere): so no
    # handler of the tested code can ever interrupt the guard and look at its frame. The main thread waits in
    # C on a lock that only the end of the run releases.
    quit_now, done = os._exit, _thread.allocate_lock()
    done.acquire()

    def work() -> None:
        try:
            code = pytest.main(cfg["argv"], plugins=[Recorder()])
            audit("agentgym.finish", int(code))  # the hook writes the report and ends the process
        finally:
            quit_now(1)

    callers[id(work.__code__)] = "agentgym.finish"
    install(cfg.pop("key"), callers)
    del callers
    gc.collect()
    gc.freeze()  # the hook, its cells and state: invisible to gc.get_objects/get_referrers from here on
    threading.Thread(target=work, name="agentgym-tests", daemon=True).start()
    try:
        done.acquire()  # never released: the run ends by os._exit in the worker (or the hook)
    finally:
        quit_now(1)


if __name__ == "__main__":
    _agentgym_boot()
