"""Reads a student's compiled object files, for scripts/grade: code that can only be what it claims.

The student's source is screened before it is built (amplab_screen.py); this looks at what the
compiler made of it, where no spelling can hide anything. Each object of a grading variant (the
student's code in some holes, the reference's in the others) is held against the reference's
object of the same file (binutils' nm and objdump):

  - it defines no external symbol the reference's does not, of the kinds that would take the
    place of someone else's: a C name (`write`, `fork`, `malloc`: the linker would bind the
    test's own calls to it), anything that names the test framework or the grading (testing::,
    amplab::test, a std::vector of the grader's types), the global operator new and delete, and
    no strong definition in the libraries' namespaces (std::, at::, c10::, torch::, amplab::).
    Helpers of the student's own (their namespace, the lab's) are fine;
  - it calls nothing outside a vetted list that the reference does not call too: C functions
    only from VETTED_C (memory, strings, maths, printing to the console, the C++ runtime: no
    process, file, environment, signal, IPC, socket, dynamic loading or raw system calls), and
    none of the C++ library's files, threads or the test framework (REFUSED_CPP);
  - it runs nothing before main() that the reference does not: no static initializer of its own
    beyond the one <iostream> makes; and nothing from the loader after main() returns (a function
    in .fini_array, or the older .ctors/.dtors, that the reference's object has none of).
check() returns one line per finding, for the note the student sees.
"""
from __future__ import annotations

import re
import subprocess

# C functions and objects any lab code may use: memory and strings, maths, formatting, printing to
# the console, the allocator, the C++ runtime and unwinder, the locks the C++ library inlines.
VETTED_C = re.compile(r"""^(
    mem(cpy|move|set|cmp|chr)|str(len|nlen|cmp|ncmp|chr|rchr|str|cpy|ncpy|cat|ncat|tol|toul|toll|toull|tod|tof|told|error)|
    ato[ifl]|abs|labs|llabs|div|qsort|bsearch|tolower|toupper|is(alpha|digit|alnum|space|upper|lower|punct|xdigit|print)|
    __ctype_(b|tolower|toupper)_loc|__errno_location|
    (v?s?n?printf|puts|putchar|fputs|fputc|putc|fwrite|fflush|stdout|stderr)|
    __(v?s?n?printf|fprintf|vfprintf|memcpy|memmove|memset|strcpy|strncpy|strcat|strncat|stpcpy)_chk|__stack_chk_fail|
    __fdelt_chk|__chk_fail|__assert_fail|abort|
    (malloc|calloc|realloc|free|posix_memalign|aligned_alloc|memalign)|
    (a?(sin|cos|tan)h?|atan2|exp|exp2|expm1|log|log2|log10|log1p|pow|sqrt|cbrt|fabs|floor|ceil|round|lround|llround|
     rint|lrint|llrint|nearbyint|trunc|fmod|remainder|fmin|fmax|fma|hypot|erfc?|lgamma|tgamma|ldexp|frexp|modf|
     copysign|nextafter|scalbn|ilogb|logb)[fl]?|__(isnan|isinf|finite|fpclassify|signbit)[fl]?|
    __cxa_\w+|__gxx_personality_v0|_Unwind_\w+|__dynamic_cast|__dso_handle|_GLOBAL_OFFSET_TABLE_|__tls_get_addr|
    __stack_chk_guard|__(u?div|u?mod|mul|neg|ashl|ashr|lshr|u?cmp|popcount|clz|ctz|bswap|float|fix|extend|trunc|pow)\w*|
    pthread_(mutex_\w+|once|key_create|key_delete|getspecific|setspecific|self|equal|cond_\w+|rwlock_\w+)|
    __pthread_key_create|__libc_single_threaded|clock_gettime|gettimeofday|time|
    (__cuda\w+|cuda(?!Ipc)[A-Z]\w*|__device_stub\w*|__nv_\w+|__fatbinwrap\w*)
)$""", re.VERBOSE)

# C++ library parts no lab code needs and an attacker would: files, threads, the test framework,
# torch's serialization (a path in, a file out), ATen's kernels called past the dispatcher, the op
# observers and their switches (a test watches which ops a TODO calls through them; one of the
# student's would see the outputs of every op the test computes, its expected values among them),
# the tensor allocators' setters (a test counts a TODO's allocations through the CPU allocator), and
# the dispatcher's registration of kernels (one registered over ATen's would run inside every op a
# test computes with).
REFUSED_CPP = re.compile(r"""(
    std::(__cxx11::)?basic_(i|o)?fstream|std::(__cxx11::)?basic_filebuf|std::filesystem::|__gnu_cxx::stdio_(sync_)?filebuf|
    std::thread::_M_start_thread|std::this_thread::|std::system|
    (^|\W)testing::|amplab::test::|
    torch::serialize::|torch::(save|load|pickle_save|pickle_load)\b|torch::jit::|at::from_file|caffe2::serialize::|
    c10::(Pickler|Unpickler)|
    torch::distributed|c10d::|
    at::native::|at::(addThreadLocalCallback|addGlobalCallback|clearCallbacks|clearThreadLocalCallbacks|
                      clearGlobalCallbacks|removeCallback|enableRecordFunction|set_record_function_tls_)\b|
    c10::(SetCPUAllocator|SetAllocator)\b|
    torch::Library\b|(torch|c10)::RegisterOperators\b|c10::Dispatcher::
)""", re.VERBOSE)

# Namespaces of others: a strong definition there replaces the library's; a weak one is a template
# instantiation or an inline function from a header, which is normal, except in these.
PROTECTED_STRONG = ("std::", "at::", "c10::", "torch::", "amplab::", "testing::", "__gnu_cxx::", "__cxxabiv1::")
PROTECTED_ANY = ("testing::", "amplab::test::")
# The replaceable global allocation functions (operator new/delete and their array, aligned and
# nothrow forms): hooks into every allocation of the program.
REPLACEABLE = re.compile(r"^_Z(nw|na|dl|da)")
# What <iostream>'s static initializer calls; anything else run before main() is the student's own.
STARTUP_ALLOWED = re.compile(r"^(_ZNSt8ios_base4Init(C1|D1)Ev|__cxa_atexit|__dso_handle|_ZSt4cout|_ZStL8__ioinit|"
                             r"_GLOBAL__sub_I_\w+|_Z41__static_initialization_and_destruction_0ii)$")


def symbols(obj):
    """({defined external symbol: nm type}, {undefined symbol})."""
    out = subprocess.run(["nm", "-P", str(obj)], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"nm {obj}: {out.stderr.strip()}")
    defined, undefined = {}, set()
    for line in out.stdout.splitlines():
        fields = line.split()
        if len(fields) < 2:
            continue
        name, kind = fields[0], fields[1]
        if "." in name:  # the compiler's own (DW.ref.__gxx_personality_v0, .LC0): no one can name them
            continue
        if kind in ("U", "w", "v"):
            undefined.add(name)
        elif kind.isupper() or kind in ("u", "i"):
            defined[name] = kind
    return defined, undefined


def demangle(names):
    names = list(names)
    if not names:
        return {}
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True)
    plain = out.stdout.splitlines() if out.returncode == 0 else names
    return dict(zip(names, plain + names[len(plain):]))


# Names a CUDA object's own start-up (the fat binary's registration, made by nvcc) refers to.
CUDA_REGISTRATION = re.compile(r"^(_ZL\d+)?__(sti____cudaRegisterAll|cudaRegister\w*|cudaUnregister\w*|nv_\w+|"
                               r"fatbinwrap\w*|device_stub\w*)|^_ZL\d+__nv_cudaEntityRegisterCallback")


def startup_calls(obj):
    """The symbols the object's static initializers refer to or call ([] when it has none): its
    relocations, and the local functions it calls, which need none."""
    headers = subprocess.run(["objdump", "-h", str(obj)], capture_output=True, text=True).stdout
    if ".init_array" not in headers:
        return []
    listing = subprocess.run(["objdump", "-dr", str(obj)], capture_output=True, text=True).stdout
    found, inside = [], False
    for line in listing.splitlines():
        function = re.match(r"^[0-9a-f]+ <([^>]+)>:", line)
        if function:
            name = function.group(1)
            inside = name.startswith(("_GLOBAL__sub_I_", "_Z41__static_initialization_and_destruction")) or \
                "__static_initialization_and_destruction" in name
            continue
        if inside:
            found += re.findall(r"R_X86_64_\w+\s+([^\s+-]+)", line)
            found += re.findall(r"\bcall\w*\s+[0-9a-f]+\s+<([^>+]+)", line)
    names = [n for n in found if not n.startswith(".") and not CUDA_REGISTRATION.match(n)]
    return names if found else ["(an initializer)"]


def loader_sections(obj):
    """The sections of functions the loader runs after main() returns, or the old way around it, that the
    object has (a C++ object's static destructors go through __cxa_atexit instead, and its initializers
    through .init_array, which startup_calls reads)."""
    headers = subprocess.run(["objdump", "-h", str(obj)], capture_output=True, text=True).stdout
    return {name for name in (".fini_array", ".ctors", ".dtors") if re.search(rf"\s{re.escape(name)}(\.\S*)?\s", headers)}


def check(obj, reference_obj):
    """What the object at `obj` does that the reference's object of the same file does not and no
    lab code may: one line per finding ([] when there is none)."""
    defined, undefined = symbols(obj)
    ref_defined, ref_undefined = symbols(reference_obj) if reference_obj else ({}, set())
    findings = []
    new_defined = {n: k for n, k in defined.items() if n not in ref_defined}
    new_undefined = sorted(n for n in undefined if n not in ref_undefined)
    names = demangle(list(new_defined) + new_undefined)
    for name, kind in sorted(new_defined.items()):
        plain = names[name]
        if not name.startswith("_Z"):
            findings.append(f"it defines '{plain}', a C name: that would replace the C library's or the grader's")
        elif any(p in plain for p in PROTECTED_ANY) or (kind not in ("W", "V", "u") and plain.startswith(PROTECTED_STRONG)):
            # (a library template specialized over the grader's types belongs to the grader too)
            findings.append(f"it defines '{plain[:120]}', which belongs to a library or the grader")
        elif REPLACEABLE.match(name):
            findings.append(f"it defines '{plain}': it would replace the program's allocator, which runs "
                            "inside every check")
    for name in new_undefined:
        plain = names[name]
        if not name.startswith("_Z"):
            if not VETTED_C.match(name):
                findings.append(f"it calls '{name}', which lab code may not (no process, file, environment, signal, "
                                "IPC, socket, dynamic-loading or system-call functions)")
        elif REFUSED_CPP.search(plain):
            findings.append(f"it calls '{plain[:120]}', which lab code may not (files, threads, the test framework, ATen kernels past the dispatcher, op observers, "
                            "allocators, kernel registration)")
    if reference_obj is not None:
        for section in sorted(loader_sections(obj) - loader_sections(reference_obj)):
            findings.append(f"it has a {section} section (a function the loader runs around main(), such as one marked "
                            "destructor): lab code may not")
        theirs = set(startup_calls(reference_obj))
        extra = [s for s in startup_calls(obj) if not STARTUP_ALLOWED.match(s) and s not in theirs]
        if extra:
            findings.append("it runs code before main() (a static object's constructor: " + ", ".join(
                sorted(set(demangle(extra).values()))[:3]) + "): lab code may not")
    return findings
