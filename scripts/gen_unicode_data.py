#!/usr/bin/env python3
# Writes model/unicode_data.cpp: the code point ranges of the Unicode letter (L*), number (N*) and
# punctuation (P*) categories, from Python's unicodedata, for the tokenizers' pre-split rules.
# Usage: python3 scripts/gen_unicode_data.py > model/unicode_data.cpp
import sys
import unicodedata

# Category tags; must match sy::UnicodeCat in model/unicode_cats.hpp.
TAGS = {"L": 1, "N": 2, "P": 3}


def ranges():
    out = []
    for cp in range(0x110000):
        tag = TAGS.get(unicodedata.category(chr(cp))[0], 0)
        if out and out[-1][2] == tag and out[-1][1] == cp - 1:
            out[-1][1] = cp
        else:
            out.append([cp, cp, tag])
    # Everything not listed is "other", so only the tagged runs are kept.
    return [r for r in out if r[2]]


def main():
    rs = ranges()
    w = sys.stdout.write
    w("// Unicode letter/number/punctuation ranges (Unicode %s) for the tokenizers' "
      "pre-split rules.\n" % unicodedata.unidata_version)
    w("// Written by scripts/gen_unicode_data.py; rerun it instead of editing by hand.\n")
    w('#include "model/unicode_cats.hpp"\n\nnamespace sy::unicode_detail {\n\n')
    w("const Range kRanges[] = {\n")
    for i in range(0, len(rs), 4):
        w("   " + "".join(" {0x%X, 0x%X, %d}," % tuple(r) for r in rs[i:i + 4]) + "\n")
    w("};\n")
    w("const size_t kRangeCount = sizeof(kRanges) / sizeof(kRanges[0]);\n\n")
    w("}  // namespace sy::unicode_detail\n")


if __name__ == "__main__":
    main()
