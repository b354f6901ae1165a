#!/usr/bin/env python3
"""Checks constrained generations against their constraints with independent validators.

    check_constrained.py RESULTS.jsonl

Each line: {"kind": "json_schema"|"regex"|"choices"|"grammar", "spec": ..., "text": str,
"finish": "stop"|"length"}. An output that ended with "stop" must satisfy its constraint:
JSON Schema by python3-jsonschema, regex by Python's re.fullmatch, choices by membership, and the
grammars by the recursive-descent checkers below (named by "spec"). "length" outputs are counted,
not checked (the constraint may not have been met before max_tokens). Prints one summary line per
constraint and every failure; exits 1 if any output fails.
"""
import json
import re
import sys

import jsonschema


def arith(text):
    """expr ::= term (("+"|"-") term)*; term ::= factor (("*"|"/") factor)*;
    factor ::= [0-9]+ | "(" expr ")" -- the whole text."""
    pos = 0

    def expr():
        nonlocal pos
        term()
        while pos < len(text) and text[pos] in '+-':
            pos += 1
            term()

    def term():
        nonlocal pos
        factor()
        while pos < len(text) and text[pos] in '*/':
            pos += 1
            factor()

    def factor():
        nonlocal pos
        if pos < len(text) and text[pos] == '(':
            pos += 1
            expr()
            if pos >= len(text) or text[pos] != ')':
                raise ValueError('expected ) at %d' % pos)
            pos += 1
            return
        start = pos
        while pos < len(text) and text[pos].isdigit() and text[pos].isascii():
            pos += 1
        if pos == start:
            raise ValueError('expected a digit or ( at %d' % pos)

    expr()
    if pos != len(text):
        raise ValueError('trailing text at %d' % pos)


def words(text):
    """root ::= word (" " word){0,5} "." with word ::= [a-z]+ | "\"" [^"\n]{0,6} "\"" """
    if not re.fullmatch(r'(?:[a-z]+|"[^"\n]{0,6}")(?: (?:[a-z]+|"[^"\n]{0,6}")){0,5}\.', text,
                        re.S):
        raise ValueError('not a word list')


GRAMMARS = {'arith': arith, 'words': words}


def check(kind, spec, text):
    if kind == 'json_schema':
        jsonschema.validate(json.loads(text), spec)
    elif kind == 'regex':
        if not re.fullmatch(spec, text):
            raise ValueError('no full match')
    elif kind == 'choices':
        if text not in spec:
            raise ValueError('not one of the choices')
    elif kind == 'grammar':
        GRAMMARS[spec](text)
    else:
        raise ValueError('unknown kind ' + kind)


def main():
    stats = {}
    failed = 0
    with open(sys.argv[1], encoding='utf-8') as f:
        for n, line in enumerate(f, 1):
            r = json.loads(line)
            key = r.get('name', r['kind'])
            s = stats.setdefault(key, [0, 0, 0])
            if r['finish'] != 'stop':
                s[1] += 1
                continue
            try:
                check(r['kind'], r['spec'], r['text'])
                s[0] += 1
            except Exception as e:  # every validator's refusal is a failure of the constraint
                s[2] += 1
                failed += 1
                print('FAIL line %d (%s): %r: %s' % (n, key, r['text'], e))
    for key, (ok, length, bad) in sorted(stats.items()):
        print('%s: %d valid, %d ended by length, %d invalid' % (key, ok, length, bad))
    sys.exit(1 if failed else 0)


if __name__ == '__main__':
    main()
