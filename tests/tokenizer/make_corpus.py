#!/usr/bin/env python3
"""Writes tests/tokenizer/corpus.json: hard strings for the tokenizer goldens.

Rerun after editing: python3 tests/tokenizer/make_corpus.py. The output is
committed; the goldens are generated from it at test time.
"""
import json
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))

fixed = [
    "",
    " ",
    "  ",
    "\t",
    "\n",
    "\r\n",
    "Hello",
    "Hello world",
    " Hello world",
    "Hello, world! How are you today?",
    "hello   world",
    "The quick brown fox jumps over the lazy dog.",
    "THE QUICK BROWN FOX",
    "I'm sure you'll say it's what they'd've done, wouldn't you? We're here, I've seen.",
    "I'M SURE YOU'LL SAY IT'S WHAT THEY'D'VE DONE",
    "'s 't 're 've 'm 'll 'd",
    "'S 'T 'RE 'VE 'M 'LL 'D",
    "don't DON'T Don'T",
    "rock 'n' roll",
    "''''",
    "\"quoted\" 'single' `back`",
    # digits
    "0", "1", "12", "123", "1234", "12345", "123456", "1234567", "12345678901234567890",
    "3.14159", "-42", "+7", "1,000,000", "1e10", "0x1F", "2024-01-31", "12:30:45",
    "v1.2.3", "abc123def", "123abc", "a1b2c3", "١٢٣٤٥", "٣.١٤", "१२३४", "一二三", "Ⅻ", "½ ¾ ²",
    "phone: +1 (555) 123-4567", "$100.00", "€50", "100%",
    # whitespace
    "a  b", "a   b", "a    b", "a\tb", "a\t\tb", "a\nb", "a\n\nb", "a\n\n\nb", "a\r\nb", "a\r\n\r\nb",
    "   leading", "trailing   ", "  both  ", "\n\nstarts with newlines", "ends with newlines\n\n",
    "mixed \t \n \r\n whitespace", "tab\tseparated\tvalues\n1\t2\t3",
    "non\u00a0breaking\u00a0space", "\u00a0\u00a0", "em\u2003space", "ideographic\u3000space",
    "thin\u2009space", "zero\u200bwidth", "line\u2028separator", "para\u2029separator",
    "narrow\u202fnbsp", "\u0085next line", "\x0bvertical\x0ctab form",
    " \n \n ", "\n \n", "x \n y", "x\n y", "x \ny", "          ten spaces", "a" + " " * 30 + "b",
    # punctuation and symbols
    "!!!", "???", "...", "—", "–", "…", "!?!?", "(parens) [brackets] {braces} <angles>",
    "a+b=c", "x^2 + y^2 = z^2", "a|b|c", "~tilde~", "#hash @at &amp; *star*", "C:\\path\\to\\file",
    "http://example.com/path?q=1&r=2#frag", "user@example.com", "<html><body>hi</body></html>",
    "«guillemets» „quotes“ “curly” ‘single’", "§ ¶ † ‡ • ‰ ′ ″", "© ® ™", "← → ↑ ↓ ⇒ ∀ ∃ ∈ ∑ √ ∞ ≠ ≤ ≥",
    "¡Hola! ¿Qué tal?",
    # scripts
    "Привет, мир! Как дела?", "Γειά σου Κόσμε", "שלום עולם", "مرحبا بالعالم", "नमस्ते दुनिया",
    "হ্যালো বিশ্ব", "สวัสดีชาวโลก", "ສະບາຍດີ", "ជំរាបសួរ", "안녕하세요 세계", "こんにちは世界", "カタカナとひらがな",
    "你好，世界！", "中华人民共和国", "繁體中文測試", "Tiếng Việt có dấu", "Ελληνικά ΚΕΦΑΛΑΙΑ",
    "Ադրբեջան", "ქართული", "አማርኛ", "ᚠᚢᚦᚨᚱᚲ", "𐌰𐌱𐌲", "ꦗꦮ", "Türkçe İıĞğŞş", "Straße STRASSE ß",
    "Ærøskøbing", "Łódź Żółć", "česky ěščřžýáíé", "Ñandú", "ﬁ ﬂ ligatures", "ǅ ǈ ǋ titlecase",
    "ﾊﾝｶｸ half-width", "ＦＵＬＬ　ＷＩＤＴＨ", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝐁𝐨𝐥𝐝", "𝟙𝟚𝟛",
    # combining marks
    "e\u0301", "cafe\u0301", "n\u0303", "a\u0300\u0301\u0302\u0303", "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319",
    "\u0915\u094d\u0937", "\u0e01\u0e34\u0e4a", "\u05e9\u05c1\u05b8", "\u0301 leading combining",
    # emoji
    "😀", "😀😃😄", "I ❤️ NY", "👍🏽", "👍🏻👍🏼👍🏽👍🏾👍🏿", "👨‍👩‍👧‍👦", "👩🏽‍💻", "🏳️‍🌈", "🇺🇸🇫🇷🇯🇵", "1️⃣ #️⃣",
    "🧑‍🤝‍🧑", "emoji 🎉 in 🎊 text", "🙈🙉🙊", "☃ ☂ ☀", "🀄🃏", "\U0001f9d1\u200d\U0001f680",
    # code
    "def foo(x):\n    return x + 1\n",
    "int main(void) {\n\tprintf(\"hi\\n\");\n\treturn 0;\n}\n",
    "for (int i = 0; i < n; ++i) { a[i] = b[i] * 2; }",
    "const f = (a, b) => a ?? b;",
    "fn main() { let v: Vec<u8> = vec![1, 2, 3]; println!(\"{:?}\", v); }",
    "SELECT * FROM users WHERE id = 42 AND name LIKE '%bob%';",
    "#include <stdio.h>\n#define MAX(a,b) ((a)>(b)?(a):(b))",
    "if x != None and y >= 3:\n\tpass\nelif z:\n  break",
    "<?php echo $var; ?>",
    "package main\n\nimport \"fmt\"\n\nfunc main() {\n\tfmt.Println(\"hello\")\n}",
    "public static void main(String[] args) throws Exception {}",
    "    indented four\n        indented eight\n\t\ttabs",
    "x = [1,2,3]\ny = {'a': 1, \"b\": 2}",
    "```python\nprint('hi')\n```",
    "// comment\n/* block */ -- sql -- # shell",
    "$ ls -la | grep '^d' > out.txt 2>&1",
    "{\"key\": [1, 2, {\"nested\": null}], \"t\": true}",
    "a_b_c __init__ __name__ == '__main__'",
    "camelCaseWord PascalCaseWord snake_case_word kebab-case-word",
    "x=1;y=2;z=x+y", "i++ --j ->ptr ::scope <<shift>>", "<=>", "!==", "&&||",
    # long words
    "supercalifragilisticexpialidocious",
    "pneumonoultramicroscopicsilicovolcanoconiosis",
    "Donaudampfschifffahrtselektrizitätenhauptbetriebswerkbauunterbeamtengesellschaft",
    "a" * 200,
    "ab" * 100,
    "xyz" * 70,
    "😀" * 40,
    "中" * 60,
    "1" * 50,
    "-" * 80,
    "=" * 33,
    " " * 64,
    "\n" * 20,
    "\t" * 10,
    "http://" + "a" * 100 + ".com",
    # special tokens inside text (SmolLM2 / ChatML / Llama)
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n",
    "text<|im_end|>more",
    "<|im_start|><|im_end|>",
    "<|im_start|> spaced <|im_end|>",
    "a<|endoftext|>b<|endoftext|>c",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n",
    "<|im_start", "im_start|>", "<|im_end|", "<|im_end|>|>", "<<|im_end|>>",
    "<repo_name>foo<file_sep>bar<filename>baz.py",
    "<jupyter_code>print(1)<jupyter_output>1<empty_output>",
    "<s>", "</s>", "<unk>", "<s>[INST] hi [/INST]", "text </s> more <s>",
    "<|eot_id|>", "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>",
    "<think>\n\n</think>\n\n",
    "<|user_tok|>", "a<|user_tok|>b", " <|user_tok|> x <|user_tok|><|user_tok|>", "<s>a</s><|user_tok|>",
    # invalid-looking but valid UTF-8
    "\u0000", "a\u0000b", "\u0001\u0002\u0003", "\u007f", "\u0080\u0081\u009f", "\ufeffBOM", "\ufffd",
    "\uffff", "\U0010ffff", "\U000e0041\U000e0042", "\ue000 private use", "\U000f0000",
    "\u00ad soft hyphen", "\u200d\u200c joiners", "\u2060word joiner", "\u202eRTL override\u202c",
    "\u0600\u0601 arabic number signs", "\u180e mongolian vowel sep" if False else "mongolian",
    "Ｈｅｌｌｏ", "ℌ𝔢𝔩𝔩𝔬", "\u2126 ohm \u212b angstrom",
    # mixed
    "The price is $4.99 (≈ €4.50) — cheap!",
    "Email me at test.user+tag@sub.example.co.uk!!!",
    "She said, \"It's 5 o'clock.\"",
    "Numbers: 1, 22, 333, 4444, 55555.",
    "Mixed日本語and English文字",
    "Русский text with English words",
    "עברית with English ומספרים 123",
    "العربية 123 English",
    "Line one.\nLine two.\n\nParagraph two.",
    "Q: What is 2+2?\nA: 4",
    "- item 1\n- item 2\n  - nested",
    "1. first\n2. second",
    "| col1 | col2 |\n|------|------|\n| a    | b    |",
    "# Heading\n\n## Sub\n\n**bold** _italic_ `code`",
    "Temperature: -5°C / 23°F",
    "π ≈ 3.14, e ≈ 2.718",
    "H₂O CO₂ x² y³",
    "a/b/c\\d\\e",
    "tab\t\ttab\t",
    " ' quote after space",
    " 's",
    "  's",
    "\n's",
    "x's y'S z'LL",
    "ﬀ ﬃ ﬄ",
    "ŉ",
    "İstanbul",
    "ΣΑΣ σας",
]

random.seed(1234)
pool = ("abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,;:!?'\"-()[]{}\n\t"
        "éüñçøßåæ中文字日本語한국어Привет😀👍🏽✓→αβγ  \n")
generated = []
for i in range(120):
    n = random.randint(1, 60)
    generated.append("".join(random.choice(pool) for _ in range(n)))

words = ["the", "of", "and", "to", "in", "is", "you", "that", "it", "he", "was", "for", "on", "are", "as",
         "with", "his", "they", "I", "at", "be", "this", "have", "from", "or", "one", "had", "by", "word",
         "but", "not", "what", "all", "were", "we", "when", "your", "can", "said", "there", "use", "an",
         "each", "which", "she", "do", "how", "their", "if", "will", "up", "other", "about", "out", "many"]
for i in range(40):
    n = random.randint(3, 25)
    s = " ".join(random.choice(words) for _ in range(n))
    if i % 3 == 0:
        s = s.capitalize() + "."
    if i % 5 == 0:
        s += " " + str(random.randint(0, 10 ** random.randint(1, 9)))
    generated.append(s)

corpus = fixed + generated
seen = set()
out = []
for s in corpus:
    if s not in seen:
        seen.add(s)
        out.append(s)
assert len(out) >= 300, len(out)
with open(os.path.join(HERE, "corpus.json"), "w", encoding="utf-8") as f:
    json.dump(out, f, ensure_ascii=False, indent=0)
    f.write("\n")
print(f"{len(out)} strings")
