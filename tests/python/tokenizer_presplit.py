#!/usr/bin/python3
# Reference pre-splits of the byte-level BPE pre-tokenizers, made with the `regex` module
# (Debian's python3-regex), for tests/unit/test_tokenizer_presplit.cpp to compare against.
#
# Each pre-tokenizer is the sequence of regexes llama.cpp uses for it. Every regex is applied to
# every word the previous one produced: its matches become words, and so does the text between
# two matches (llama.cpp's std::regex_iterator loop). Before matching, non-ASCII white space is
# replaced by U+000B as llama.cpp does, so it never joins an explicit character class; the words
# are cut from the original text. `$` of ECMAScript (end of input only) is written \Z here.
# Llama 3 and Qwen2 use llama.cpp's spelling of the contractions, (?:'[sS]|'[tT]|...): the
# (?i:'s|'t|...) of their tokenizer.json would also fold non-ASCII letters ("'ſ" matching "'s"),
# which llama.cpp, whose ids are the reference, does not.
#
# Output: one line per (pre-tokenizer, case): NAME TAB hex(text) TAB hex(word),hex(word),...
# with all text in UTF-8.
import random
import sys

import regex

GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
LLAMA3_BODY = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
               r"|[^\r\n\p{L}\p{N}]?\p{L}+|{digits}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
               r"|\s+(?!\S)|\s+")
CJK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
# deepseek-llm's letter class as llama.cpp writes it; the six characters that Unicode
# normalization would fold into other ones are escaped.
DEEPSEEK_LETTERS = (
    "\\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕ"
    "ἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-\u1f7dᾀ-ᾴᾶ-ᾼ\u1fbeῂ-ῄῆ-ῌῐ-\u1fd3ῖ-\u1fdbῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤ\u2126ℨ\u212a-ℭℯ-ℴ"
    "ℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+")

PRE_TOKENIZERS = {
    "gpt2": [GPT2],
    "llama3": [LLAMA3_BODY.replace("{digits}", r"\p{N}{1,3}")],
    "qwen2": [LLAMA3_BODY.replace("{digits}", r"\p{N}")],
    "default": [r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"],
    "falcon": [r"[\p{P}\$\+<=>\^~\|`]+", GPT2, r"[0-9][0-9][0-9]"],
    "starcoder": [r"\p{N}", GPT2],
    "deepseek-coder": [r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", CJK, r"\p{N}"],
    "deepseek-llm": [r"[\r\n]", DEEPSEEK_LETTERS, "\\s?[!-/:-~！-／：-～‘-‟\u3000-。]+", r"\s+\Z", CJK,
                     r"\p{N}+"],
}

# Written strings where the rules differ: contractions, digit runs, CJK, emoji, white-space runs,
# newlines, accents, punctuation runs and scripts inside and outside DeepSeek's letter class.
CORPUS = [
    "",
    "Hello world",
    " Hello World!",
    "I've been 'told he's there, 'RE you sure? 'M not sure I'll make it, 'D you like some tea?",
    "We'Ve a'lL don't DON'T it's IT'S 'S 's 'x '",
    "'ſ ſ's Straße",
    "3 33 333 3333 33333 333333 3333333 33333333 3.3 3..3 3...3 1,000,000 -42 +7 0x1F",
    "٣٤٥٦ ١٢ ½ ⅓ Ⅻ ② ¹²³ 12½",
    "我想在apple工作1314151天～ 今日は、世界！ 안녕하세요 세계",
    "こんにちは カタカナ ｶﾀｶﾅ 中文，标点。“引号” 「括弧」",
    "🚀 (normal) 😶‍🌫️ (multiple emojis concatenated) ✅ 🦙🦙 👨‍👩‍👧",
    " ", "  ", "   ", "\t", "\t\t a", "a  \n\n  b", "  \n", "x   ", "   y",
    "\n", "\n\n", "\n\n\n", "\r\n\r\n", "a\nb\r\nc\rd", "\n =", " \n \n\n",
    "\u3000x\u3000\u3000y \u00a0\u00a0z\u2003w\u2028v\u0085u",
    "\x1c\x1d\x1e\x1f a\x0bb\x0cc",
    "Führer Äpfel Việt Nam Ελληνικά Кириллица Հայերեն ქართული ǅemal ℌilbert Ωmega Kelvin",
    "e\u0301 n\u0303o a\u0308b \u0301lead",
    "......!!!!!!?????? ''''''``````` \"\"\"\" ------======= «quoted» ‘single’ (全角)",
    "$100 + 5 <= x^2 | ~y @home #tag %20 &amp; *ptr [i] {k} \\n _x_",
    "int main() { return a->b + c[i]; } // comment\n\tif (x == 1) {\n\t\ty++;\n\t}",
    "\ufffd\ufffd bad \ufffd",
    "  multiple   spaces   between   words  ",
    "ALL CAPS, MiXeD cAsE, and_underscores-and-dashes",
    "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n🚀 (normal) 😶‍🌫️ (multiple emojis "
    "concatenated) ✅ 🦙🦙 3 33 333 3333 33333 333333 3333333 33333333 3.3 3..3 3...3 "
    "ကာကြသးဝေမျိုးသည်🚀 ?我想在apple工作1314151天～ ------======= нещо на Български "
    "''''''```````\"\"\"\"......!!!!!!?????? I've been 'told he's there, 'RE you sure? 'M "
    "not sure I'll make it, 'D you like some tea? We'Ve a'lL",
]

# Characters for generated strings: the classes the rules tell apart, class edges (U+0800,
# U+9FA5 / U+9FA6, U+D7FF), white space in and outside ASCII, and contraction pieces.
POOL = (list("aZ09 '\t\n\r.,!?$+<=>^~|`-_()[]{}\"\\/@#%&*;:") +
        ["'s", "'S", "'ll", "'Re", "'ve", "'D", "'m", "'t", "  ", "\n\n", "\u3000", "\u00a0",
         "\u0085", "\x0b", "\x0c", "\x1c", "\u2028", "\u2003", "\u200b", "\u0301", "\ufffd"] +
        list("我想在工作天一龥丁가힣ア、。「」！？，：～（）‘’“”éÄüßſǅµԱաႠᏸᲐ٣½Ⅻ²①") +
        ["\u2126", "\u212a", "\u2018", "\u201f", "\uff01", "\uff5e", "\u0800", "\u9fa5", "\u9fa6",
         "\ud7ff", "🚀", "😶\u200d🌫️", "✅"])
GENERATED = 300  # strings per pre-tokenizer; a fixed seed keeps them the same on every run


def generated_corpus():
    rng = random.Random(13)
    return ["".join(rng.choice(POOL) for _ in range(rng.randint(0, 25))) for _ in range(GENERATED)]


def white_to_vt(text):
    return "".join("\x0b" if ord(ch) > 0x7F and regex.match(r"\s", ch) else ch for ch in text)


def split(text, patterns):
    # Offsets are found on the text with white space replaced; words are cut from the original.
    probe = white_to_vt(text)
    spans = [(0, len(text))] if text else []
    for pattern in patterns:
        compiled = regex.compile(pattern)
        out = []
        for start, end in spans:
            pos = start
            for m in compiled.finditer(probe, start, end):
                if m.start() > pos:
                    out.append((pos, m.start()))
                out.append((m.start(), m.end()))
                pos = m.end()
            if pos < end:
                out.append((pos, end))
        spans = out
    return [text[a:b] for a, b in spans]


def hexs(s):
    return s.encode("utf-8").hex()


def main():
    w = sys.stdout.write
    corpus = CORPUS + generated_corpus()
    for name, patterns in PRE_TOKENIZERS.items():
        for text in corpus:
            words = split(text, patterns)
            assert "".join(words) == text
            w("%s\t%s\t%s\n" % (name, hexs(text), ",".join(hexs(x) for x in words)))


if __name__ == "__main__":
    main()
