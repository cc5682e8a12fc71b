"""Reads a student's source file before it is compiled, for scripts/grade: what a submission
may not contain, because it would reach outside the student's own code at build time or take
control of the test process around the tests.

  - any preprocessor directive but a plain #include and a loop-unrolling #pragma (no #define,
    #line, #if, other #pragmas, #embed...), except the directive lines the course's own starter file has: #line would make the compiler quote
    any file it can read into the build log, a macro can turn code into a string;
  - #include of anything but a plain name of a header (<...> or "..."): no absolute path, no '..',
    no macro, no source file (.cpp, .cu, ...), nothing of GoogleTest;
  - inline assembly (asm, __asm__: the assembler's .incbin reads any file into the program);
  - token pasting (##: it can build the words above out of harmless pieces);
  - the test framework's namespace (testing::), and #define of a C++ keyword (#define private public);
  - functions run before main() or after exit by attribute (constructor, destructor, init_priority,
    section, and their __name__ spellings), in `__attribute__((...))`, `__attribute((...))` or
    `[[...]]`, however the attribute's brackets are laid out over lines.
Comments and string literals are skipped, and backslash-newline splices joined first, so these are
found however comments, strings and splices lay the text out. screen() returns one line per
finding: 'line N: what; why'.
"""
from __future__ import annotations

import re

INCLUDE = re.compile(r'^(?:include|include_next|import|embed)\b\s*(.*)$')
PLAIN_NAME = re.compile(r'^(<[^<>"]+>|"[^<>"]+")\s*$')
KEYWORDS = {"private", "protected", "public", "class", "struct", "friend", "virtual", "override", "final",
            "static", "const", "return", "if", "else", "for", "while", "do", "true", "false", "nullptr",
            "namespace", "using", "template", "typename", "operator", "new", "delete", "this", "extern"}
ASM = {"asm", "__asm", "__asm__"}
RUN_AROUND_MAIN = {"constructor", "destructor", "init_priority", "section"}
HEADER_SUFFIXES = ("", ".h", ".hpp", ".hh", ".hxx", ".cuh", ".inl")
UNROLL = re.compile(r"^pragma\s+(unroll(\s+\w+)?|GCC\s+unroll\s+\w+|nounroll)\s*$")  # a loop hint, nothing more


def splice(text):
    """[(original line number, logical line)]: backslash-newline joined."""
    lines, current, first = [], [], None
    for number, line in enumerate(text.split("\n"), start=1):
        if first is None:
            first = number
        if line.endswith("\\"):
            current.append(line[:-1])
            continue
        current.append(line)
        lines.append((first, "".join(current)))
        current, first = [], None
    if current:
        lines.append((first, "".join(current)))
    return lines


RAW_STRING = re.compile(r'(?:u8|u|U|L)?R"([^()\\ ]{0,16})\(')


def strip_literals(lines):
    """The same lines with comments removed and string/char literal contents blanked (a raw
    string, a block comment may span lines); directive lines are kept whole apart from comments."""
    out, in_block, raw_end = [], False, None
    for number, line in lines:
        text, i, kept = line, 0, []
        while i < len(text):
            if raw_end is not None:
                end = text.find(raw_end, i)
                if end < 0:
                    i = len(text)
                    continue
                kept.append('"')
                i, raw_end = end + len(raw_end), None
                continue
            if in_block:
                end = text.find("*/", i)
                if end < 0:
                    i = len(text)
                    continue
                i, in_block = end + 2, False
                kept.append(" ")
                continue
            if text.startswith("//", i):
                break
            if text.startswith("/*", i):
                in_block, i = True, i + 2
                continue
            raw = RAW_STRING.match(text, i)
            if raw and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
                kept.append('"')
                raw_end, i = ")" + raw.group(1) + '"', raw.end()
                continue
            if text[i] in "\"'":
                quote, j = text[i], i + 1
                while j < len(text) and text[j] != quote:
                    j += 2 if text[j] == "\\" else 1
                literal = text[i:j + 1]
                # keep an include's name readable; blank every other literal
                kept.append(literal if quote == '"' and kept_is_include(kept) else quote + quote)
                i = j + 1
                continue
            kept.append(text[i])
            i += 1
        out.append((number, "".join(kept)))
    return out


def kept_is_include(kept):
    return re.match(r'^\s*(#|%:)\s*(include|include_next|import|embed)\b', "".join(kept)) is not None


def screen(text: str, given: str = "") -> list:
    """Findings in `text`, a student's file; `given` is the course's untouched starter of the same
    file, whose own directive lines are allowed."""
    findings = []
    given_directives = {line.strip() for _, line in splice(given) if re.match(r'^\s*(#|%:)', line)}
    raw_lines = dict(splice(text))
    code = strip_literals(splice(text))
    for number, line in code:
        directive = re.match(r'^\s*(?:#|%:)\s*(.*)$', line)
        if directive:
            body = directive.group(1)
            if not INCLUDE.match(body) and not UNROLL.match(body) and \
                    raw_lines.get(number, line).strip() not in given_directives:
                word = (body.split() or [""])[0][:20]
                findings.append(f"line {number}: #{word}: only #include (and the course's own directive lines) "
                                "may be used in a submission")
                continue
            include = INCLUDE.match(body)
            if include:
                name = include.group(1).strip()
                plain = PLAIN_NAME.match(name)
                if not plain:
                    findings.append(f"line {number}: #include {name[:60]}: only a plain <name> or \"name\" "
                                    "may be included")
                    continue
                target = plain.group(1)[1:-1]
                if target.startswith("/") or ".." in target.split("/") or "\\" in target:
                    findings.append(f"line {number}: #include {plain.group(1)}: a path outside the lab's and the "
                                    "library's headers (absolute or with '..') may not be included")
                elif target.split("/")[0] in ("gtest", "gmock"):
                    findings.append(f"line {number}: #include {plain.group(1)}: the test framework's headers may "
                                    "not be included in lab code")
                elif not target.lower().endswith(HEADER_SUFFIXES[1:]) and "." in target.rsplit("/", 1)[-1]:
                    findings.append(f"line {number}: #include {plain.group(1)}: only headers may be included, "
                                    "not source files")
                continue
            define = re.match(r'^define\s+([A-Za-z_]\w*)', body)
            if define and define.group(1) in KEYWORDS:
                findings.append(f"line {number}: #define {define.group(1)}: redefining a C++ keyword is not allowed")
        if "##" in line:
            findings.append(f"line {number}: ## (token pasting) is not allowed in a submission")
        words = set(re.findall(r"[A-Za-z_]\w*", line))
        for word in sorted(words & ASM):
            findings.append(f"line {number}: {word}: inline assembly is not allowed in a submission")
        if re.search(r"\btesting\s*::|\bnamespace\s+testing\b", line):
            findings.append(f"line {number}: testing::: the test framework is not for lab code")
    for number, found in attributes_run_around_main(code):
        findings.append(f"line {number}: attribute '{found}': code run before main() or after exit "
                        "(or placed in a section of its own) is not allowed")
    return findings


ATTRIBUTE_START = re.compile(r"\b__attribute(__)?\b|\[\s*\[")  # GCC takes both spellings


def attributes_run_around_main(code):
    """[(line, word)] for each attribute of `code` ([(line number, text without literals)]) that names
    one of RUN_AROUND_MAIN: `__attribute__` and the brackets after it, or `[[` to its `]]`, read
    across lines."""
    text, starts = "", []
    for number, line in code:
        starts.append((len(text), number))
        text += line + "\n"

    def line_of(offset):
        return max(n for at, n in starts if at <= offset)

    found = []
    for start in ATTRIBUTE_START.finditer(text):
        i, depth, opened = start.end(), 0, False
        if text[start.start()] == "[":
            depth, opened = 2, True
        while i < len(text):
            c = text[i]
            if c in "([":
                depth, opened = depth + 1, True
            elif c in ")]":
                depth -= 1
            elif not opened and not c.isspace():
                break  # __attribute__ not followed by its brackets
            i += 1
            if opened and depth <= 0:
                break
        # GCC takes an attribute's name with or without its double underscores: __destructor__
        words = {re.sub(r"^__(\w+)__$", r"\1", w) for w in re.findall(r"[A-Za-z_]\w*", text[start.end():i])}
        words &= RUN_AROUND_MAIN
        if words:
            found.append((line_of(start.start()), sorted(words)[0]))
    return found


CLOSING = {")": "(", "]": "[", "}": "{"}


def lexical_state(text: str):
    """Where C++ text leaves a reader at its end: (what it is inside: code, a comment, a string, a
    raw string, a directive; the brackets still open, innermost last; whether the last line goes on
    with a backslash). Two prefixes in the same state read what follows them the same way: text
    put after either is code at the same depth, never part of a string, a comment or a macro's
    arguments."""
    mode, stack, i, n, raw_end = "code", [], 0, len(text), None
    at_line_start = True
    while i < n:
        c = text[i]
        if c == "\\" and text.startswith("\n", i + 1) and mode in ("code", "line", "directive", "string", "char"):
            i += 2
            continue
        if mode == "code":
            if c == "\n":
                at_line_start = True
                i += 1
                continue
            if at_line_start and c == "#":
                mode, i = "directive", i + 1
                continue
            if not c.isspace():
                at_line_start = False
            if text.startswith("//", i):
                mode, i = "line", i + 2
            elif text.startswith("/*", i):
                mode, i = "block", i + 2
            elif (raw := RAW_STRING.match(text, i)) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
                mode, raw_end, i = "raw string", ")" + raw.group(1) + '"', raw.end()
            elif c == '"':
                mode, i = "string", i + 1
            elif c == "'" and not (i > 0 and text[i - 1].isalnum()):  # 1'000 is a number
                mode, i = "char", i + 1
            else:
                if c in "([{":
                    stack.append(c)
                elif c in CLOSING:
                    if stack and stack[-1] == CLOSING[c]:
                        stack.pop()
                    else:
                        stack.append(c)  # a closer with nothing to close: a state no reference text expects
                i += 1
        elif mode in ("line", "directive"):
            if c == "\n":
                mode, at_line_start = "code", True
            elif mode == "directive" and text.startswith("/*", i):
                mode, i = "block", i + 1
            i += 1
        elif mode == "block":
            if text.startswith("*/", i):
                mode, i = "code", i + 2
            else:
                i += 1
        elif mode in ("string", "char"):
            quote = '"' if mode == "string" else "'"
            if c == "\\":
                i += 2
            elif c == quote or c == "\n":
                mode, i = "code", i + 1
            else:
                i += 1
        else:  # raw string
            end = text.find(raw_end, i)
            if end < 0:
                i = n
            else:
                mode, i = "code", end + len(raw_end)
    continued = text.endswith("\\\n") or text.endswith("\\")
    return mode, tuple(stack), continued


def describe_state(state) -> str:
    mode, stack, continued = state
    if mode != "code":
        return f"a {mode} open"
    if continued:
        return "a line continued with a backslash"
    return f"the brackets {''.join(stack) or 'none'} open"
