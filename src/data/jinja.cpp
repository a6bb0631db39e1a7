// The chat-template interpreter (jinja.h): a lexer that reproduces Jinja2's whitespace handling
// (trim_blocks, lstrip_blocks, "-" and "+"), a recursive-descent parser that follows Jinja2's
// grammar (its precedence: filters and tests bind tighter than arithmetic, "~" tighter than "+",
// "**" left-associative) into a small AST, and a tree-walking evaluator over Python-like values.
// The evaluator mirrors Python where templates can see it: str() and repr() of values, truthiness,
// ==, ordering, int/float arithmetic, str methods, and Jinja2's scoping (a for loop's iteration
// and a macro are scopes, an if is not). Everything created during a render lives for that render.
#include "data/jinja.h"

#include <utf8proc.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <functional>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "base/error.h"

namespace mt::data {

using json = nlohmann::ordered_json;  // a context is Python dicts: insertion order

namespace {

constexpr size_t kMaxOutput = size_t{64} << 20;  // bytes of any one rendered text or string value
constexpr int kMaxCallDepth = 64;                 // nested macro calls (Python's own limit is ~1000 frames)
constexpr int kMaxNesting = 100;                  // nested blocks and expressions in the parser
constexpr int64_t kMaxSteps = 5'000'000;          // loop iterations and calls in one render
constexpr int64_t kMaxRange = 100'000;            // Jinja2's sandbox MAX_RANGE

// A runtime failure without a line: the statement that runs it adds "chat template line N: ".
// raised: raise_exception's, reported as "chat template: <message>" without a line.
struct Fail {
  std::string message;
  bool raised = false;
};
[[noreturn]] void fail(std::string message) { throw Fail{std::move(message), false}; }

// ---- UTF-8 ----------------------------------------------------------------------------------

// The code point at s[i] and its length; a byte that does not start valid UTF-8 is itself.
std::pair<char32_t, size_t> decode(std::string_view s, size_t i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) return {b0, 1};
  size_t n = b0 >= 0xF0 ? 4 : b0 >= 0xE0 ? 3 : b0 >= 0xC0 ? 2 : 0;
  if (n == 0 || i + n > s.size()) return {b0, 1};
  char32_t c = b0 & (0x7F >> n);
  for (size_t k = 1; k < n; ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if ((b & 0xC0) != 0x80) return {b0, 1};
    c = (c << 6) | (b & 0x3F);
  }
  return {c, n};
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

std::u32string to_u32(std::string_view s) {
  std::u32string r;
  r.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    auto [c, n] = decode(s, i);
    r.push_back(c);
    i += n;
  }
  return r;
}

std::string to_utf8(std::u32string_view s) {
  std::string r;
  r.reserve(s.size());
  for (char32_t c : s) append_utf8(r, c);
  return r;
}

size_t u32_length(std::string_view s) {
  size_t n = 0;
  for (size_t i = 0; i < s.size(); i += decode(s, i).second) ++n;
  return n;
}

// Python's str.isspace() (also what re's \s matches).
bool is_space(char32_t c) {
  if (c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F)) return true;
  if (c < 0x80) return false;
  return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
         c == 0x202F || c == 0x205F || c == 0x3000;
}

utf8proc_category_t category(char32_t c) { return utf8proc_category(static_cast<utf8proc_int32_t>(c)); }

bool is_alpha(char32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
  const auto k = category(c);
  return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT ||
         k == UTF8PROC_CATEGORY_LM || k == UTF8PROC_CATEGORY_LO;
}
bool is_digit(char32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  return category(c) == UTF8PROC_CATEGORY_ND;
}
bool is_numeric(char32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  const auto k = category(c);
  return k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
}
bool is_word(char32_t c) { return c == '_' || is_alpha(c) || is_numeric(c); }  // re's \w

char32_t to_upper(char32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') ? c - 32 : c;
  return static_cast<char32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(c)));
}
char32_t to_lower(char32_t c) {
  if (c < 0x80) return (c >= 'A' && c <= 'Z') ? c + 32 : c;
  return static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c)));
}
char32_t to_title(char32_t c) {
  if (c < 0x80) return to_upper(c);
  return static_cast<char32_t>(utf8proc_totitle(static_cast<utf8proc_int32_t>(c)));
}
bool is_lower_char(char32_t c) { return to_upper(c) != c && to_lower(c) == c; }
bool is_upper_char(char32_t c) { return to_lower(c) != c && to_upper(c) == c; }
bool is_cased(char32_t c) {
  if (to_lower(c) != c || to_upper(c) != c) return true;
  const auto k = category(c);
  return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT;
}

// Python's full case mappings where they differ from utf8proc's simple ones (one code point to
// several): ß and the Latin ligatures up, İ down, and the Greek final sigma.
void append_upper(std::string& out, char32_t c) {
  switch (c) {
    case 0xDF: out.append("SS"); return;
    case 0x149: out.append("\u02BCN"); return;
    case 0xFB00: out.append("FF"); return;
    case 0xFB01: out.append("FI"); return;
    case 0xFB02: out.append("FL"); return;
    case 0xFB03: out.append("FFI"); return;
    case 0xFB04: out.append("FFL"); return;
    case 0xFB05:
    case 0xFB06: out.append("ST"); return;
    default: append_utf8(out, to_upper(c));
  }
}
void append_title(std::string& out, char32_t c) {
  switch (c) {
    case 0xDF: out.append("Ss"); return;
    case 0xFB00: out.append("Ff"); return;
    case 0xFB01: out.append("Fi"); return;
    case 0xFB02: out.append("Fl"); return;
    case 0xFB03: out.append("Ffi"); return;
    case 0xFB04: out.append("Ffl"); return;
    case 0xFB05:
    case 0xFB06: out.append("St"); return;
    default: append_utf8(out, to_title(c));
  }
}
// u[k] lower-cased; a capital sigma ending a word (after a cased letter, before none) is final.
void append_lower(std::string& out, const std::u32string& u, size_t k) {
  const char32_t c = u[k];
  if (c == 0x130) {
    out.append("i\u0307");
  } else if (c == 0x3A3 && k > 0 && is_cased(u[k - 1]) && (k + 1 == u.size() || !is_cased(u[k + 1]))) {
    append_utf8(out, 0x3C2);
  } else {
    append_utf8(out, to_lower(c));
  }
}

std::string upper_str(std::string_view s) {
  std::string r;
  r.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    auto [c, n] = decode(s, i);
    append_upper(r, c);
    i += n;
  }
  return r;
}

std::string lower_str(std::string_view s) {
  const std::u32string u = to_u32(s);
  std::string r;
  r.reserve(s.size());
  for (size_t k = 0; k < u.size(); ++k) append_lower(r, u, k);
  return r;
}

// Python's str.isprintable() for one code point: what repr() keeps unescaped.
bool is_printable(char32_t c) {
  if (c < 0x80) return c >= 0x20 && c < 0x7F;
  switch (category(c)) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS:
      return false;
    default:
      return true;
  }
}

std::string_view rstrip_space(std::string_view s) {
  size_t keep = 0;
  for (size_t i = 0; i < s.size();) {
    auto [c, n] = decode(s, i);
    i += n;
    if (!is_space(c)) keep = i;
  }
  return s.substr(0, keep);
}

bool all_space(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    auto [c, n] = decode(s, i);
    if (!is_space(c)) return false;
    i += n;
  }
  return true;
}

void check_size(size_t n) {
  if (n > kMaxOutput) fail("a string or the output exceeds " + std::to_string(kMaxOutput >> 20) + " MiB");
}

// ---- values ---------------------------------------------------------------------------------

enum class Type : uint8_t { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kNamespace, kCallable, kLoop };
// What Python object a list value stands for: it decides printing, len() and truthiness. kIterator
// is a generator or iterator (what select, map, reverse... return): always true, no len().
enum class Seq : uint8_t { kList, kTuple, kIterator, kKeys, kValues, kItems, kRange };

struct Value;
using List = std::vector<Value>;
struct Dict;
struct Callable;
struct LoopState;

struct Value {
  Type type = Type::kUndefined;
  Seq seq = Seq::kList;
  bool unsafe = false;  // an undefined from an attribute the sandbox refuses: calling it is the error
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;  // a string; an undefined's hint; a range's repr
  std::shared_ptr<const List> list;
  std::shared_ptr<Dict> dict;  // a dict (never changed once built) or a namespace's attributes
  std::shared_ptr<const Callable> fn;
  std::shared_ptr<LoopState> loop;

  static Value undefined(std::string hint) {
    Value v;
    v.s = std::move(hint);
    return v;
  }
  static Value none() {
    Value v;
    v.type = Type::kNone;
    return v;
  }
  static Value boolean(bool x) {
    Value v;
    v.type = Type::kBool;
    v.b = x;
    return v;
  }
  static Value integer(int64_t x) {
    Value v;
    v.type = Type::kInt;
    v.i = x;
    return v;
  }
  static Value number(double x) {
    Value v;
    v.type = Type::kFloat;
    v.f = x;
    return v;
  }
  static Value str(std::string x) {
    Value v;
    v.type = Type::kString;
    v.s = std::move(x);
    return v;
  }
  static Value make_list(List items, Seq seq = Seq::kList) {
    Value v;
    v.type = Type::kList;
    v.seq = seq;
    v.list = std::make_shared<const List>(std::move(items));
    return v;
  }
  static Value make_dict(std::shared_ptr<Dict> d) {
    Value v;
    v.type = Type::kDict;
    v.dict = std::move(d);
    return v;
  }

  bool is_undefined() const { return type == Type::kUndefined; }
  bool is_number() const { return type == Type::kBool || type == Type::kInt || type == Type::kFloat; }
  bool is_int() const { return type == Type::kBool || type == Type::kInt; }  // Python's bool is an int
  int64_t as_int() const { return type == Type::kBool ? int64_t{b} : i; }
  double as_float() const { return type == Type::kFloat ? f : static_cast<double>(as_int()); }
};

// A Python dict with str keys, in insertion order.
struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  const Value* find(std::string_view key) const {
    for (const auto& [k, v] : items)
      if (k == key) return &v;
    return nullptr;
  }
  void set(const std::string& key, Value v) {
    for (auto& [k, old] : items) {
      if (k == key) {
        old = std::move(v);
        return;
      }
    }
    items.emplace_back(key, std::move(v));
  }
};

struct Args {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
};

struct Callable {
  std::string name;
  bool macro = false;
  std::function<Value(Args&)> call;
};

// A for loop's "loop" object.
struct LoopState {
  std::shared_ptr<const List> items;
  size_t index = 0;
  std::optional<List> last_changed;
};

Value make_callable(std::string name, std::function<Value(Args&)> fn) {
  Value v;
  v.type = Type::kCallable;
  auto c = std::make_shared<Callable>();
  c->name = std::move(name);
  c->call = std::move(fn);
  v.fn = std::move(c);
  return v;
}

// Python's type names, for error messages as Python words them.
std::string type_name(const Value& v) {
  switch (v.type) {
    case Type::kUndefined: return "Undefined";
    case Type::kNone: return "NoneType";
    case Type::kBool: return "bool";
    case Type::kInt: return "int";
    case Type::kFloat: return "float";
    case Type::kString: return "str";
    case Type::kList:
      switch (v.seq) {
        case Seq::kList: return "list";
        case Seq::kTuple: return "tuple";
        case Seq::kIterator: return "generator";
        case Seq::kKeys: return "dict_keys";
        case Seq::kValues: return "dict_values";
        case Seq::kItems: return "dict_items";
        case Seq::kRange: return "range";
      }
      return "list";
    case Type::kDict: return "dict";
    case Type::kNamespace: return "Namespace";
    case Type::kCallable: return "function";
    case Type::kLoop: return "LoopContext";
  }
  return "object";
}

// Jinja2's UndefinedError for an undefined value used where a value is needed.
[[noreturn]] void undefined_error(const Value& v) {
  fail(v.s.empty() ? std::string("a value is undefined") : v.s);
}

// ---- printing: Python's str(), repr() and json.dumps ----------------------------------------

// Python's repr() of a float: the shortest digits that round-trip, in exponent form outside
// 1e-4 <= |x| < 1e16, with ".0" on integral values.
std::string float_repr(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x < 0 ? "-inf" : "inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), std::fabs(x), std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  const size_t e = sci.find('e');
  std::string digits = sci.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int exp10 = std::atoi(sci.c_str() + e + 1);
  std::string out;
  if (std::signbit(x)) out.push_back('-');
  const int decpt = exp10 + 1;  // digits are 0.d1d2... x 10^decpt
  if (decpt <= -4 || decpt > 16) {
    out.push_back(digits[0]);
    if (digits.size() > 1) {
      out.push_back('.');
      out.append(digits, 1, std::string::npos);
    }
    out.push_back('e');
    out.push_back(exp10 < 0 ? '-' : '+');
    const int a = std::abs(exp10);
    if (a < 10) out.push_back('0');
    out.append(std::to_string(a));
  } else if (decpt <= 0) {
    out.append("0.");
    out.append(static_cast<size_t>(-decpt), '0');
    out.append(digits);
  } else if (static_cast<size_t>(decpt) >= digits.size()) {
    out.append(digits);
    out.append(static_cast<size_t>(decpt) - digits.size(), '0');
    out.append(".0");
  } else {
    out.append(digits, 0, static_cast<size_t>(decpt));
    out.push_back('.');
    out.append(digits, static_cast<size_t>(decpt), std::string::npos);
  }
  return out;
}

void hex_escape(std::string& out, const char* prefix, char32_t c, int width) {
  static const char* kHex = "0123456789abcdef";
  out.append(prefix);
  for (int k = width - 1; k >= 0; --k) out.push_back(kHex[(c >> (4 * k)) & 0xF]);
}

// Python's repr() of a str: single quotes unless the text has ' and no ".
void string_repr(std::string_view s, std::string& out) {
  const bool dq = s.find('\'') != std::string_view::npos && s.find('"') == std::string_view::npos;
  const char q = dq ? '"' : '\'';
  out.push_back(q);
  for (size_t i = 0; i < s.size();) {
    auto [c, n] = decode(s, i);
    i += n;
    if (c == static_cast<char32_t>(q) || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c == '\n') {
      out.append("\\n");
    } else if (c == '\r') {
      out.append("\\r");
    } else if (c == '\t') {
      out.append("\\t");
    } else if (is_printable(c)) {
      append_utf8(out, c);
    } else if (c < 0x100) {
      hex_escape(out, "\\x", c, 2);
    } else if (c < 0x10000) {
      hex_escape(out, "\\u", c, 4);
    } else {
      hex_escape(out, "\\U", c, 8);
    }
  }
  out.push_back(q);
}

void repr(const Value& v, std::string& out, int depth);

// Python's str().
void to_str(const Value& v, std::string& out, int depth = 0) {
  switch (v.type) {
    case Type::kUndefined: return;
    case Type::kString: out.append(v.s); return;
    default: repr(v, out, depth);
  }
}

std::string to_str(const Value& v) {
  if (v.type == Type::kString) return v.s;
  std::string out;
  to_str(v, out);
  return out;
}

void repr(const Value& v, std::string& out, int depth) {
  if (depth > 200) fail("a value nests too deeply to print");
  switch (v.type) {
    case Type::kUndefined: out.append("Undefined"); return;
    case Type::kNone: out.append("None"); return;
    case Type::kBool: out.append(v.b ? "True" : "False"); return;
    case Type::kInt: out.append(std::to_string(v.i)); return;
    case Type::kFloat: out.append(float_repr(v.f)); return;
    case Type::kString: string_repr(v.s, out); return;
    case Type::kList: {
      const char* close = "]";
      switch (v.seq) {
        case Seq::kList: out.push_back('['); break;
        case Seq::kTuple: out.push_back('('); close = v.list->size() == 1 ? ",)" : ")"; break;
        case Seq::kKeys: out.append("dict_keys(["); close = "])"; break;
        case Seq::kValues: out.append("dict_values(["); close = "])"; break;
        case Seq::kItems: out.append("dict_items(["); close = "])"; break;
        case Seq::kRange: out.append(v.s); return;
        case Seq::kIterator:
          throw Error(ErrorKind::kNotSupported, "printing a generator (Python prints its address); add |list");
      }
      bool first = true;
      for (const Value& item : *v.list) {
        if (!first) out.append(", ");
        first = false;
        repr(item, out, depth + 1);
      }
      out.append(close);
      return;
    }
    case Type::kDict:
    case Type::kNamespace: {
      if (v.type == Type::kNamespace) out.append("<Namespace ");
      out.push_back('{');
      bool first = true;
      for (const auto& [k, item] : v.dict->items) {
        if (!first) out.append(", ");
        first = false;
        string_repr(k, out);
        out.append(": ");
        repr(item, out, depth + 1);
      }
      out.push_back('}');
      if (v.type == Type::kNamespace) out.push_back('>');
      return;
    }
    case Type::kCallable:
      if (v.fn->macro) {
        out.append("<Macro ");
        string_repr(v.fn->name, out);
        out.push_back('>');
      } else {
        out.append("<built-in function " + v.fn->name + ">");
      }
      return;
    case Type::kLoop:
      out.append("<LoopContext " + std::to_string(v.loop->index + 1) + "/" + std::to_string(v.loop->items->size()) +
                 ">");
      return;
  }
}

struct JsonStyle {
  std::optional<std::string> indent;
  std::string item_sep = ", ";
  std::string key_sep = ": ";
  bool sort_keys = false;
  bool ensure_ascii = false;
};

void json_string(std::string_view s, std::string& out, bool ensure_ascii) {
  out.push_back('"');
  for (size_t i = 0; i < s.size();) {
    auto [c, n] = decode(s, i);
    i += n;
    switch (c) {
      case '"': out.append("\\\""); break;
      case '\\': out.append("\\\\"); break;
      case '\n': out.append("\\n"); break;
      case '\r': out.append("\\r"); break;
      case '\t': out.append("\\t"); break;
      case '\b': out.append("\\b"); break;
      case '\f': out.append("\\f"); break;
      default:
        if (c < 0x20) {
          hex_escape(out, "\\u", c, 4);
        } else if (ensure_ascii && c >= 0x7F) {
          if (c >= 0x10000) {
            const char32_t v = c - 0x10000;
            hex_escape(out, "\\u", 0xD800 + (v >> 10), 4);
            hex_escape(out, "\\u", 0xDC00 + (v & 0x3FF), 4);
          } else {
            hex_escape(out, "\\u", c, 4);
          }
        } else {
          append_utf8(out, c);
        }
    }
  }
  out.push_back('"');
}

// Python's json.dumps(v, ensure_ascii=..., indent=..., separators=..., sort_keys=...).
void to_json(const Value& v, std::string& out, const JsonStyle& st, int level) {
  if (level > 200) fail("a value nests too deeply for tojson");
  auto newline = [&](int lv) {
    out.push_back('\n');
    for (int k = 0; k < lv; ++k) out.append(*st.indent);
  };
  switch (v.type) {
    case Type::kNone: out.append("null"); return;
    case Type::kBool: out.append(v.b ? "true" : "false"); return;
    case Type::kInt: out.append(std::to_string(v.i)); return;
    case Type::kFloat:
      if (std::isnan(v.f)) out.append("NaN");
      else if (std::isinf(v.f)) out.append(v.f < 0 ? "-Infinity" : "Infinity");
      else out.append(float_repr(v.f));
      return;
    case Type::kString: json_string(v.s, out, st.ensure_ascii); return;
    case Type::kList:
      if (v.seq == Seq::kList || v.seq == Seq::kTuple) {
        if (v.list->empty()) {
          out.append("[]");
          return;
        }
        out.push_back('[');
        bool first = true;
        for (const Value& item : *v.list) {
          if (!first) out.append(st.item_sep);
          first = false;
          if (st.indent) newline(level + 1);
          to_json(item, out, st, level + 1);
        }
        if (st.indent) newline(level);
        out.push_back(']');
        return;
      }
      break;
    case Type::kDict: {
      if (v.dict->items.empty()) {
        out.append("{}");
        return;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.dict->items) items.push_back(&kv);
      if (st.sort_keys)
        std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      out.push_back('{');
      bool first = true;
      for (const auto* kv : items) {
        if (!first) out.append(st.item_sep);
        first = false;
        if (st.indent) newline(level + 1);
        json_string(kv->first, out, st.ensure_ascii);
        out.append(st.key_sep);
        to_json(kv->second, out, st, level + 1);
      }
      if (st.indent) newline(level);
      out.push_back('}');
      return;
    }
    default:
      break;
  }
  fail("Object of type " + type_name(v) + " is not JSON serializable");
}

// ---- Python semantics -----------------------------------------------------------------------

bool truthy(const Value& v) {
  switch (v.type) {
    case Type::kUndefined:
    case Type::kNone: return false;
    case Type::kBool: return v.b;
    case Type::kInt: return v.i != 0;
    case Type::kFloat: return v.f != 0;
    case Type::kString: return !v.s.empty();
    case Type::kList: return v.seq == Seq::kIterator || !v.list->empty();
    case Type::kDict: return !v.dict->items.empty();
    default: return true;
  }
}

bool py_eq(const Value& a, const Value& b, int depth = 0) {
  if (depth > 200) fail("a value nests too deeply to compare");
  if (a.is_number() && b.is_number()) {
    if (a.is_int() && b.is_int()) return a.as_int() == b.as_int();
    return a.as_float() == b.as_float();
  }
  if (a.type != b.type) return false;
  switch (a.type) {
    case Type::kUndefined:
    case Type::kNone: return true;
    case Type::kString: return a.s == b.s;
    case Type::kList: {
      if (a.list == b.list) return true;
      const bool seq_a = a.seq == Seq::kList || a.seq == Seq::kTuple || a.seq == Seq::kRange;
      if (!seq_a || a.seq != b.seq || a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k)
        if (!py_eq((*a.list)[k], (*b.list)[k], depth + 1)) return false;
      return true;
    }
    case Type::kDict: {
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& [k, v] : a.dict->items) {
        const Value* o = b.dict->find(k);
        if (o == nullptr || !py_eq(v, *o, depth + 1)) return false;
      }
      return true;
    }
    case Type::kNamespace: return a.dict == b.dict;
    case Type::kCallable: return a.fn == b.fn;
    case Type::kLoop: return a.loop == b.loop;
    default: return false;
  }
}

// Python's a < b (three-way: -1, 0, 1); a TypeError for types Python does not order.
int py_cmp(const Value& a, const Value& b, const char* op) {
  if (a.is_undefined()) undefined_error(a);
  if (b.is_undefined()) undefined_error(b);
  if (a.is_number() && b.is_number()) {
    if (a.is_int() && b.is_int()) return a.as_int() < b.as_int() ? -1 : a.as_int() > b.as_int() ? 1 : 0;
    const double x = a.as_float(), y = b.as_float();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.type == Type::kString && b.type == Type::kString) {
    const int c = a.s.compare(b.s);  // byte order of UTF-8 is code point order
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.type == Type::kList && b.type == Type::kList && a.seq == b.seq &&
      (a.seq == Seq::kList || a.seq == Seq::kTuple)) {
    const size_t n = std::min(a.list->size(), b.list->size());
    for (size_t k = 0; k < n; ++k) {
      if (!py_eq((*a.list)[k], (*b.list)[k])) return py_cmp((*a.list)[k], (*b.list)[k], op);
    }
    return a.list->size() < b.list->size() ? -1 : a.list->size() > b.list->size() ? 1 : 0;
  }
  fail(std::string("'") + op + "' not supported between instances of '" + type_name(a) + "' and '" + type_name(b) +
       "'");
}

// Python's iter(): the items a for loop or a filter sees.
std::shared_ptr<const List> iterate(const Value& v) {
  switch (v.type) {
    case Type::kUndefined: return std::make_shared<const List>();
    case Type::kList: return v.list;
    case Type::kDict: {
      List keys;
      keys.reserve(v.dict->items.size());
      for (const auto& kv : v.dict->items) keys.push_back(Value::str(kv.first));
      return std::make_shared<const List>(std::move(keys));
    }
    case Type::kString: {
      List chars;
      for (size_t i = 0; i < v.s.size();) {
        const size_t n = decode(v.s, i).second;
        chars.push_back(Value::str(v.s.substr(i, n)));
        i += n;
      }
      return std::make_shared<const List>(std::move(chars));
    }
    case Type::kLoop: return v.loop->items;
    default: fail("'" + type_name(v) + "' object is not iterable");
  }
}

// Python's len().
int64_t py_len(const Value& v) {
  switch (v.type) {
    case Type::kUndefined: return 0;
    case Type::kString: return static_cast<int64_t>(u32_length(v.s));
    case Type::kList:
      if (v.seq == Seq::kIterator) fail("object of type 'generator' has no len()");
      return static_cast<int64_t>(v.list->size());
    case Type::kDict: return static_cast<int64_t>(v.dict->items.size());
    case Type::kLoop: return static_cast<int64_t>(v.loop->items->size());
    default: fail("object of type '" + type_name(v) + "' has no len()");
  }
}

bool py_in(const Value& item, const Value& container) {
  switch (container.type) {
    case Type::kString:
      if (item.type != Type::kString) fail("'in <string>' requires string as left operand, not " + type_name(item));
      return container.s.find(item.s) != std::string::npos;
    case Type::kDict: return item.type == Type::kString && container.dict->find(item.s) != nullptr;
    case Type::kUndefined: return false;
    case Type::kList:
      for (const Value& x : *container.list)
        if (py_eq(x, item)) return true;
      return false;
    default: fail("argument of type '" + type_name(container) + "' is not iterable");
  }
}

int64_t checked(bool overflow, int64_t r) {
  if (overflow) throw Error(ErrorKind::kNotSupported, "chat template: an integer exceeds 64 bits");
  return r;
}

// Python's ints are unbounded; these stop at 64 bits.
int64_t add_int(int64_t a, int64_t b) {
  int64_t r = 0;
  const bool o = __builtin_add_overflow(a, b, &r);
  return checked(o, r);
}
int64_t sub_int(int64_t a, int64_t b) {
  int64_t r = 0;
  const bool o = __builtin_sub_overflow(a, b, &r);
  return checked(o, r);
}
int64_t mul_int(int64_t a, int64_t b) {
  int64_t r = 0;
  const bool o = __builtin_mul_overflow(a, b, &r);
  return checked(o, r);
}

int64_t floor_div(int64_t a, int64_t b) {
  if (b == 0) fail("integer division or modulo by zero");
  if (a == INT64_MIN && b == -1) checked(true, 0);
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

int64_t floor_mod(int64_t a, int64_t b) {
  if (b == 0) fail("integer division or modulo by zero");
  if (b == -1) return 0;
  int64_t m = a % b;
  if (m != 0 && ((m < 0) != (b < 0))) m += b;
  return m;
}

// Python's float divmod (Objects/floatobject.c), for // and % on floats.
std::pair<double, double> float_divmod(double x, double y) {
  if (y == 0) fail("float division by zero");
  double mod = std::fmod(x, y);
  double div = (x - mod) / y;
  if (mod != 0) {
    if ((y < 0) != (mod < 0)) {
      mod += y;
      div -= 1.0;
    }
  } else {
    mod = std::copysign(0.0, y);
  }
  double floordiv;
  if (div != 0) {
    floordiv = std::floor(div);
    if (div - floordiv > 0.5) floordiv += 1.0;
  } else {
    floordiv = std::copysign(0.0, x / y);
  }
  return {floordiv, mod};
}

Value repeat(const Value& seq, int64_t n) {
  if (seq.type == Type::kString) {
    std::string r;
    if (n > 0) {
      check_size(seq.s.size() * static_cast<size_t>(n));
      for (int64_t k = 0; k < n; ++k) r.append(seq.s);
    }
    return Value::str(std::move(r));
  }
  List r;
  if (n > 0) {
    check_size(seq.list->size() * static_cast<size_t>(n));
    for (int64_t k = 0; k < n; ++k) r.insert(r.end(), seq.list->begin(), seq.list->end());
  }
  return Value::make_list(std::move(r), seq.seq);
}

Value binary(const std::string& op, const Value& a, const Value& b) {
  if (a.is_undefined()) undefined_error(a);
  if (b.is_undefined()) undefined_error(b);
  auto type_error = [&]() -> Value {
    fail("unsupported operand type(s) for " + op + ": '" + type_name(a) + "' and '" + type_name(b) + "'");
  };
  const bool ints = a.is_int() && b.is_int();
  const bool nums = a.is_number() && b.is_number();
  if (op == "+") {
    if (ints) return Value::integer(add_int(a.as_int(), b.as_int()));
    if (nums) return Value::number(a.as_float() + b.as_float());
    if (a.type == Type::kString && b.type == Type::kString) {
      check_size(a.s.size() + b.s.size());
      std::string s = a.s;
      s.append(b.s);
      return Value::str(std::move(s));
    }
    if (a.type == Type::kList && b.type == Type::kList && a.seq == b.seq &&
        (a.seq == Seq::kList || a.seq == Seq::kTuple)) {
      List l = *a.list;
      l.insert(l.end(), b.list->begin(), b.list->end());
      return Value::make_list(std::move(l), a.seq);
    }
    if (a.type == Type::kString || b.type == Type::kString)
      fail("can only concatenate str (not \"" + type_name(a.type == Type::kString ? b : a) + "\") to str");
    return type_error();
  }
  if (op == "-") {
    if (ints) return Value::integer(sub_int(a.as_int(), b.as_int()));
    if (nums) return Value::number(a.as_float() - b.as_float());
    return type_error();
  }
  if (op == "*") {
    if (ints) return Value::integer(mul_int(a.as_int(), b.as_int()));
    if (nums) return Value::number(a.as_float() * b.as_float());
    auto seq = [](const Value& v) {
      return v.type == Type::kString || (v.type == Type::kList && (v.seq == Seq::kList || v.seq == Seq::kTuple));
    };
    if (seq(a) && b.is_int()) return repeat(a, b.as_int());
    if (a.is_int() && seq(b)) return repeat(b, a.as_int());
    return type_error();
  }
  if (op == "/") {
    if (!nums) return type_error();
    if (b.as_float() == 0) fail("division by zero");
    return Value::number(a.as_float() / b.as_float());
  }
  if (op == "//") {
    if (ints) return Value::integer(floor_div(a.as_int(), b.as_int()));
    if (nums) return Value::number(float_divmod(a.as_float(), b.as_float()).first);
    return type_error();
  }
  if (op == "%") {
    if (ints) return Value::integer(floor_mod(a.as_int(), b.as_int()));
    if (nums) return Value::number(float_divmod(a.as_float(), b.as_float()).second);
    if (a.type == Type::kString)
      throw Error(ErrorKind::kNotSupported, "chat template: printf-style string formatting (str % ...)");
    return type_error();
  }
  if (op == "**") {
    if (ints && b.as_int() >= 0) {
      int64_t base = a.as_int(), e = b.as_int(), acc = 1;
      while (e > 0) {
        if (e & 1) acc = mul_int(acc, base);
        e >>= 1;
        if (e > 0) base = mul_int(base, base);
      }
      return Value::integer(acc);
    }
    if (nums) {
      if (a.as_float() == 0 && b.as_float() < 0) fail("0.0 cannot be raised to a negative power");
      return Value::number(std::pow(a.as_float(), b.as_float()));
    }
    return type_error();
  }
  fail("unknown operator " + op);
}

// ---- str methods ------------------------------------------------------------------------------

std::string py_strip(std::string_view s, const Value* chars, bool left, bool right) {
  std::u32string set;
  const bool ws = chars == nullptr || chars->type == Type::kNone;
  if (!ws) {
    if (chars->type != Type::kString) fail("strip arg must be None or str");
    set = to_u32(chars->s);
  }
  const std::u32string u = to_u32(s);
  auto strip_it = [&](char32_t c) { return ws ? is_space(c) : set.find(c) != std::u32string::npos; };
  size_t b = 0, e = u.size();
  if (left)
    while (b < e && strip_it(u[b])) ++b;
  if (right)
    while (e > b && strip_it(u[e - 1])) --e;
  return to_utf8(std::u32string_view(u).substr(b, e - b));
}

List py_split(const std::string& s, const Value* sep, int64_t maxsplit) {
  List out;
  if (sep == nullptr || sep->type == Type::kNone) {
    // Runs of whitespace, none at the ends.
    const std::u32string u = to_u32(s);
    size_t i = 0;
    while (true) {
      while (i < u.size() && is_space(u[i])) ++i;
      if (i >= u.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
        out.push_back(Value::str(to_utf8(std::u32string_view(u).substr(i))));  // the rest, as it is
        break;
      }
      size_t j = i;
      while (j < u.size() && !is_space(u[j])) ++j;
      out.push_back(Value::str(to_utf8(std::u32string_view(u).substr(i, j - i))));
      i = j;
    }
    return out;
  }
  if (sep->type != Type::kString) fail("must be str or None, not " + type_name(*sep));
  if (sep->s.empty()) fail("empty separator");
  size_t pos = 0;
  while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
    const size_t k = s.find(sep->s, pos);
    if (k == std::string::npos) break;
    out.push_back(Value::str(s.substr(pos, k - pos)));
    pos = k + sep->s.size();
  }
  out.push_back(Value::str(s.substr(pos)));
  return out;
}

std::string py_replace(const std::string& s, const std::string& old, const std::string& rep, int64_t count) {
  std::string out;
  if (old.empty()) {
    // Python puts the replacement before every character and at the end.
    int64_t done = 0;
    size_t i = 0;
    while (true) {
      if (count >= 0 && done >= count) break;
      out.append(rep);
      ++done;
      if (i >= s.size()) break;
      const size_t n = decode(s, i).second;
      out.append(s, i, n);
      i += n;
      check_size(out.size());
    }
    out.append(s, std::min(i, s.size()), std::string::npos);
    return out;
  }
  size_t pos = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    const size_t k = s.find(old, pos);
    if (k == std::string::npos) break;
    out.append(s, pos, k - pos);
    out.append(rep);
    check_size(out.size());
    pos = k + old.size();
    ++done;
  }
  out.append(s, pos, std::string::npos);
  return out;
}

std::string py_capitalize(std::string_view s) {
  const std::u32string u = to_u32(s);
  std::string r;
  for (size_t k = 0; k < u.size(); ++k) {
    if (k == 0) append_title(r, u[k]);
    else append_lower(r, u, k);
  }
  return r;
}

// Python's str.title(): a cased character after an uncased one starts a word.
std::string py_title(std::string_view s) {
  const std::u32string u = to_u32(s);
  std::string r;
  bool prev_cased = false;
  for (size_t k = 0; k < u.size(); ++k) {
    if (prev_cased) append_lower(r, u, k);
    else append_title(r, u[k]);
    prev_cased = is_cased(u[k]);
  }
  return r;
}

bool py_islower(std::string_view s) {
  bool any = false;
  for (char32_t c : to_u32(s)) {
    if (is_upper_char(c) || category(c) == UTF8PROC_CATEGORY_LT) return false;
    if (is_lower_char(c)) any = true;
  }
  return any;
}
bool py_isupper(std::string_view s) {
  bool any = false;
  for (char32_t c : to_u32(s)) {
    if (is_lower_char(c) || category(c) == UTF8PROC_CATEGORY_LT) return false;
    if (is_upper_char(c)) any = true;
  }
  return any;
}

// Python's str.splitlines() boundaries.
bool is_line_break(char32_t c) {
  return c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D || c == 0x1E || c == 0x85 ||
         c == 0x2028 || c == 0x2029;
}

std::vector<std::string> py_splitlines(std::string_view s, bool keepends) {
  std::vector<std::string> out;
  const std::u32string u = to_u32(s);
  size_t i = 0;
  while (i < u.size()) {
    size_t j = i;
    while (j < u.size() && !is_line_break(u[j])) ++j;
    size_t eol = j;
    if (j < u.size()) {
      eol = (u[j] == '\r' && j + 1 < u.size() && u[j + 1] == '\n') ? j + 2 : j + 1;
    }
    out.push_back(to_utf8(std::u32string_view(u).substr(i, (keepends ? eol : j) - i)));
    i = eol;
  }
  return out;
}

// Python's slice indices for a sequence of length n.
std::vector<size_t> slice_indices(int64_t n, const Value& start, const Value& stop, const Value& step) {
  auto as_opt = [](const Value& v) -> std::optional<int64_t> {
    if (v.type == Type::kNone || v.is_undefined()) return std::nullopt;
    if (!v.is_int()) fail("slice indices must be integers or None");
    return v.as_int();
  };
  const int64_t st = as_opt(step).value_or(1);
  if (st == 0) fail("slice step cannot be zero");
  auto clamp = [&](std::optional<int64_t> x, int64_t dflt) {
    if (!x) return dflt;
    int64_t v = *x;
    if (v < 0) {
      v += n;
      if (v < 0) v = st < 0 ? -1 : 0;
    } else if (v >= n) {
      v = st < 0 ? n - 1 : n;
    }
    return v;
  };
  const int64_t b = clamp(as_opt(start), st < 0 ? n - 1 : 0);
  const int64_t e = clamp(as_opt(stop), st < 0 ? -1 : n);
  std::vector<size_t> idx;
  if (st > 0)
    for (int64_t k = b; k < e; k += st) idx.push_back(static_cast<size_t>(k));
  else
    for (int64_t k = b; k > e; k += st) idx.push_back(static_cast<size_t>(k));
  return idx;
}

// Python's int(str, base) for what Jinja2's int filter passes.
std::optional<int64_t> parse_int(std::string_view text, int64_t base) {
  std::string s = py_strip(text, nullptr, true, true);
  if (s.empty()) return std::nullopt;
  bool neg = false;
  size_t i = 0;
  if (s[0] == '+' || s[0] == '-') {
    neg = s[0] == '-';
    i = 1;
  }
  if (i + 1 < s.size() && s[i] == '0') {
    const char p = static_cast<char>(std::tolower(static_cast<unsigned char>(s[i + 1])));
    const int64_t pb = p == 'x' ? 16 : p == 'o' ? 8 : p == 'b' ? 2 : 0;
    if (pb != 0 && (base == pb || base == 0)) {
      base = pb;
      i += 2;
      if (i < s.size() && s[i] == '_') ++i;
    }
  }
  if (base == 0) base = 10;
  if (i >= s.size()) return std::nullopt;
  int64_t v = 0;
  bool prev_digit = false;
  for (; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '_') {
      if (!prev_digit) return std::nullopt;
      prev_digit = false;
      continue;
    }
    int d = -1;
    if (c >= '0' && c <= '9') d = c - '0';
    else if (c >= 'a' && c <= 'z') d = c - 'a' + 10;
    else if (c >= 'A' && c <= 'Z') d = c - 'A' + 10;
    if (d < 0 || d >= base) return std::nullopt;
    if (__builtin_mul_overflow(v, base, &v) || __builtin_add_overflow(v, d, &v)) return std::nullopt;
    prev_digit = true;
  }
  if (!prev_digit) return std::nullopt;
  return neg ? -v : v;
}

// Python's float(str).
std::optional<double> parse_float(std::string_view text) {
  std::string s = py_strip(text, nullptr, true, true);
  std::string t;
  for (size_t k = 0; k < s.size(); ++k) {
    if (s[k] == '_') {
      if (k == 0 || k + 1 == s.size() || !std::isdigit(static_cast<unsigned char>(s[k - 1])) ||
          !std::isdigit(static_cast<unsigned char>(s[k + 1])))
        return std::nullopt;
      continue;
    }
    t.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(s[k]))));
  }
  if (t.empty()) return std::nullopt;
  std::string_view body = t;
  const bool neg = body[0] == '-';
  if (body[0] == '+' || body[0] == '-') body.remove_prefix(1);
  if (body == "inf" || body == "infinity") return neg ? -HUGE_VAL : HUGE_VAL;
  if (body == "nan") return std::nan("");
  for (char c : body)
    if (!(std::isdigit(static_cast<unsigned char>(c)) || c == '.' || c == 'e' || c == '+' || c == '-'))
      return std::nullopt;
  char* end = nullptr;
  const double v = std::strtod(t.c_str(), &end);
  if (end != t.c_str() + t.size()) return std::nullopt;
  return v;
}

// Python's round(x, n) for a float: correctly rounded, ties to even (printf rounds the same way).
double py_round(double x, int64_t n) {
  if (!std::isfinite(x)) return x;
  if (n >= 0) {
    if (n > 300) return x;
    char buf[512];
    std::snprintf(buf, sizeof(buf), "%.*f", static_cast<int>(n), x);
    return std::strtod(buf, nullptr);
  }
  const double p = std::pow(10.0, static_cast<double>(-n));
  const double y = x / p;
  double r = std::nearbyint(y);  // default rounding mode: ties to even
  return r * p;
}

}  // namespace

// ---- the AST ----------------------------------------------------------------------------------

namespace {

struct Renderer;
struct Expr;
using ExprPtr = std::unique_ptr<Expr>;
struct Scope;

// A filter or test: the value, the call's arguments (after the value).
using FilterFn = Value (*)(Renderer&, const Value&, Args&);
using TestFn = bool (*)(Renderer&, const Value&, Args&);

enum class EK : uint8_t {
  kConst, kName, kList, kTuple, kDict, kGetattr, kGetitem, kSlice, kCall, kFilter, kTest,
  kNeg, kPos, kNot, kBinary, kAnd, kOr, kCompare, kCond, kConcat,
};

struct Expr {
  EK kind;
  int line = 0;
  Value value;       // kConst
  std::string name;  // kName, kGetattr's attribute, the filter or test, kBinary's operator
  // Operands: kGetattr/kGetitem/kSlice/kCall/kFilter/kTest: [subject, ...]; a filter of a
  // {% filter %} block has a null subject; kSlice's start/stop/step and kCond's else may be null.
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;  // kCall, kFilter, kTest; kDict: key exprs in args
  std::vector<std::string> ops;                         // kCompare
  FilterFn filter = nullptr;
  TestFn test = nullptr;
  bool negated = false;  // kTest: "is not"
};

enum class NK : uint8_t {
  kText, kOutput, kIf, kFor, kSet, kSetNs, kSetBlock, kMacro, kFilterBlock, kGeneration, kBreak, kContinue,
};

struct Node {
  Node(NK k, int l) : kind(k), line(l) {}
  NK kind;
  int line = 0;
  std::string text;                  // kText's text; kMacro's name; kSetNs's attribute
  ExprPtr expr;                      // kOutput, kIf's condition, kFor's iterable, kSet's value
  ExprPtr cond;                      // kFor's "if" filter
  std::vector<std::string> targets;  // kFor/kSet/kSetBlock names; kSetNs: the namespace; kMacro: parameters
  bool tuple_target = false;
  std::vector<ExprPtr> filters;   // kSetBlock, kFilterBlock
  std::vector<ExprPtr> defaults;  // kMacro: one per parameter, null where none
  std::vector<Node> body, else_body;
};

// ---- the lexer ----------------------------------------------------------------------------

enum class TK : uint8_t { kData, kVarBegin, kVarEnd, kBlockBegin, kBlockEnd, kName, kString, kInt, kFloat, kOp, kEof };

struct Token {
  TK type;
  std::string value;
  int line = 0;
  int64_t i = 0;
  double f = 0;
};

[[noreturn]] void syntax_error(int line, const std::string& what) {
  throw Error(ErrorKind::kInvalidArgument, "chat template line " + std::to_string(line) + ": " + what);
}
[[noreturn]] void not_supported(int line, const std::string& what) {
  throw Error(ErrorKind::kNotSupported, "chat template line " + std::to_string(line) + ": " + what);
}

bool name_start(char32_t c) { return c == '_' || is_alpha(c); }
bool name_char(char32_t c) {
  if (name_start(c) || is_digit(c)) return true;
  if (c < 0x80) return false;
  const auto k = category(c);
  return k == UTF8PROC_CATEGORY_MN || k == UTF8PROC_CATEGORY_MC || k == UTF8PROC_CATEGORY_PC ||
         k == UTF8PROC_CATEGORY_NL;
}

class Lexer {
 public:
  explicit Lexer(std::string_view source) {
    // Jinja2 turns \r\n and \r into \n and drops one trailing newline (keep_trailing_newline off).
    src_.reserve(source.size());
    for (size_t k = 0; k < source.size(); ++k) {
      if (source[k] == '\r') {
        src_.push_back('\n');
        if (k + 1 < source.size() && source[k + 1] == '\n') ++k;
      } else {
        src_.push_back(source[k]);
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
  }

  std::vector<Token> run() {
    // line_starting: whether the previous match ended a line; a tag at the very start of the
    // template, or right after a trimmed newline, counts as starting its line for lstrip_blocks.
    bool line_starting = true;
    while (pos_ < src_.size()) {
      size_t p = pos_;
      while (p + 1 < src_.size() && !(src_[p] == '{' && (src_[p + 1] == '%' || src_[p + 1] == '{' || src_[p + 1] == '#')))
        ++p;
      if (p + 1 >= src_.size()) {  // data to the end
        emit(TK::kData, std::string(src_.substr(pos_)), pos_);
        break;
      }
      const char kind = src_[p + 1];
      const char sign = p + 2 < src_.size() && (src_[p + 2] == '-' || src_[p + 2] == '+') ? src_[p + 2] : 0;
      std::string_view text = std::string_view(src_).substr(pos_, p - pos_);
      if (sign == '-') {
        text = rstrip_space(text);
      } else if (sign != '+' && kind != '{') {
        // lstrip_blocks: spaces and tabs from the start of the line up to a block or comment tag.
        const size_t nl = text.rfind('\n');
        const size_t l_pos = nl == std::string_view::npos ? 0 : nl + 1;
        if ((l_pos > 0 || line_starting) && l_pos < text.size() && all_space(text.substr(l_pos)))
          text = text.substr(0, l_pos);
      }
      if (!text.empty()) emit(TK::kData, std::string(text), pos_);
      const size_t tag = p;
      p += 2 + (sign ? 1 : 0);
      if (kind == '#') {
        line_starting = comment(p, tag);
      } else if (kind == '%' && raw_begin(p)) {
        line_starting = raw(tag);
      } else {
        line_starting = tag_tokens(p, kind == '%', tag);
      }
    }
    tokens_.push_back(Token{TK::kEof, "", line_of(src_.size()), 0, 0});
    return std::move(tokens_);
  }

 private:
  int line_of(size_t offset) const {
    return 1 + static_cast<int>(std::count(src_.begin(), src_.begin() + static_cast<std::ptrdiff_t>(offset), '\n'));
  }
  void emit(TK type, std::string value, size_t offset) {
    // Line numbers are counted incrementally: offsets only grow.
    while (line_pos_ < offset) {
      if (src_[line_pos_] == '\n') ++line_;
      ++line_pos_;
    }
    tokens_.push_back(Token{type, std::move(value), line_, 0, 0});
  }
  bool at(size_t p, std::string_view s) const { return src_.compare(p, s.size(), s) == 0; }
  size_t skip_space(size_t p) const {
    while (p < src_.size()) {
      auto [c, n] = decode(src_, p);
      if (!is_space(c)) break;
      p += n;
    }
    return p;
  }
  // The end of a block tag at p ("+%}", "-%}" and whitespace, or "%}" and one newline), or npos.
  size_t block_end(size_t p) const {
    if (at(p, "+%}")) return p + 3;
    if (at(p, "-%}")) return skip_space(p + 3);
    if (at(p, "%}")) return p + 2 < src_.size() && src_[p + 2] == '\n' ? p + 3 : p + 2;
    return std::string::npos;
  }

  bool comment(size_t p, size_t tag) {
    for (size_t q = p; q < src_.size(); ++q) {
      size_t end = std::string::npos;
      if (at(q, "+#}")) end = q + 3;
      else if (at(q, "-#}")) end = skip_space(q + 3);
      else if (at(q, "#}")) end = q + 2 < src_.size() && src_[q + 2] == '\n' ? q + 3 : q + 2;
      if (end != std::string::npos) {
        pos_ = end;
        return src_[end - 1] == '\n';
      }
    }
    syntax_error(line_of(tag), "Missing end of comment tag");
  }

  // "{% raw %}" (the sign already skipped): p is after "{%" and its sign.
  bool raw_begin(size_t p) {
    size_t q = skip_space(p);
    if (!at(q, "raw")) return false;
    q = skip_space(q + 3);
    if (at(q, "-%}")) {
      pos_ = skip_space(q + 3);
      return true;
    }
    if (at(q, "%}")) {
      pos_ = q + 2;  // no trim_blocks newline after {% raw %}: Jinja2's rule has none
      return true;
    }
    return false;
  }

  bool raw(size_t tag) {
    const bool starting = pos_ > 0 && src_[pos_ - 1] == '\n';
    for (size_t q = pos_; q + 1 < src_.size(); ++q) {
      if (!at(q, "{%")) continue;
      size_t r = q + 2;
      const char sign = r < src_.size() && (src_[r] == '-' || src_[r] == '+') ? src_[r] : 0;
      if (sign) ++r;
      r = skip_space(r);
      if (!at(r, "endraw")) continue;
      const size_t end = block_end(skip_space(r + 6));
      if (end == std::string::npos) continue;
      std::string_view text = std::string_view(src_).substr(pos_, q - pos_);
      if (sign == '-') {
        text = rstrip_space(text);
      } else if (sign != '+') {
        const size_t nl = text.rfind('\n');
        const size_t l_pos = nl == std::string_view::npos ? 0 : nl + 1;
        if ((l_pos > 0 || starting) && l_pos < text.size() && all_space(text.substr(l_pos)))
          text = text.substr(0, l_pos);
      }
      if (!text.empty()) emit(TK::kData, std::string(text), pos_);
      pos_ = end;
      return src_[end - 1] == '\n';
    }
    syntax_error(line_of(tag), "Missing end of raw directive");
  }

  // The tokens of a {{ }} or {% %} tag, from p (after its start and sign) to its end.
  bool tag_tokens(size_t p, bool block, size_t tag) {
    emit(block ? TK::kBlockBegin : TK::kVarBegin, "", tag);
    std::vector<char> brackets;
    while (true) {
      if (brackets.empty()) {
        size_t end = std::string::npos;
        if (block) {
          end = block_end(p);
        } else if (at(p, "-}}")) {
          end = skip_space(p + 3);
        } else if (at(p, "}}")) {
          end = p + 2;
        }
        if (end != std::string::npos) {
          emit(block ? TK::kBlockEnd : TK::kVarEnd, "", p);
          pos_ = end;
          return src_[end - 1] == '\n';
        }
      }
      if (p >= src_.size()) syntax_error(line_of(p), std::string("unexpected end of template, expected '") +
                                                         (block ? "end of statement block'" : "end of print statement'"));
      auto [c, n] = decode(src_, p);
      if (is_space(c)) {
        p += n;
        continue;
      }
      if (c >= '0' && c <= '9') {
        p = number(p);
        continue;
      }
      if (name_start(c)) {
        size_t q = p + n;
        while (q < src_.size()) {
          auto [c2, n2] = decode(src_, q);
          if (!name_char(c2)) break;
          q += n2;
        }
        emit(TK::kName, src_.substr(p, q - p), p);
        p = q;
        continue;
      }
      if (c == '\'' || c == '"') {
        p = string_literal(p);
        continue;
      }
      static const char* kOps[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%", "~", "[", "]",
                                   "(",  ")",  "{",  "}",  ">",  "<",  "=", ".", ":", "|", ",", ";"};
      const char* op = nullptr;
      for (const char* o : kOps) {
        if (at(p, o)) {
          op = o;
          break;
        }
      }
      if (op == nullptr) {
        std::string ch;
        append_utf8(ch, c);
        syntax_error(line_of(p), "unexpected char '" + ch + "'");
      }
      const char o0 = op[0];
      if (op[1] == 0 && (o0 == '(' || o0 == '[' || o0 == '{')) {
        brackets.push_back(o0 == '(' ? ')' : o0 == '[' ? ']' : '}');
      } else if (op[1] == 0 && (o0 == ')' || o0 == ']' || o0 == '}')) {
        if (brackets.empty()) syntax_error(line_of(p), std::string("unexpected '") + o0 + "'");
        if (brackets.back() != o0)
          syntax_error(line_of(p), std::string("unexpected '") + o0 + "', expected '" + brackets.back() + "'");
        brackets.pop_back();
      }
      emit(TK::kOp, op, p);
      p += std::strlen(op);
    }
  }

  // An integer or float literal (Jinja2's integer_re and float_re, underscores allowed).
  size_t number(size_t p) {
    auto digits = [&](size_t q) {  // (\d+_)*\d+ from q; returns the end, or q if none
      size_t r = q;
      while (r < src_.size() && std::isdigit(static_cast<unsigned char>(src_[r]))) {
        ++r;
        if (r + 1 < src_.size() && src_[r] == '_' && std::isdigit(static_cast<unsigned char>(src_[r + 1]))) ++r;
      }
      return r;
    };
    auto lower = [&](size_t q) { return q < src_.size() ? std::tolower(static_cast<unsigned char>(src_[q])) : 0; };
    const bool after_dot = p > 0 && src_[p - 1] == '.';
    if (!after_dot) {
      size_t q = digits(p);
      size_t frac_end = q;
      if (q < src_.size() && src_[q] == '.') {
        const size_t f = digits(q + 1);
        if (f > q + 1) frac_end = f;
      }
      size_t end = std::string::npos;
      if (lower(frac_end) == 'e') {
        size_t e = frac_end + 1;
        if (e < src_.size() && (src_[e] == '+' || src_[e] == '-')) ++e;
        const size_t ed = digits(e);
        if (ed > e) end = ed;
      }
      if (end == std::string::npos && frac_end > q) end = frac_end;
      if (end != std::string::npos) {
        std::string t;
        for (size_t k = p; k < end; ++k)
          if (src_[k] != '_') t.push_back(src_[k]);
        emit(TK::kFloat, t, p);
        tokens_.back().f = std::strtod(t.c_str(), nullptr);
        return end;
      }
    }
    // Integers: 0b/0o/0x prefixes, a decimal without a leading zero, or zeros.
    int base = 10;
    size_t q = p;
    if (src_[p] == '0' && (lower(p + 1) == 'b' || lower(p + 1) == 'o' || lower(p + 1) == 'x')) {
      base = lower(p + 1) == 'b' ? 2 : lower(p + 1) == 'o' ? 8 : 16;
      q = p + 2;
    }
    std::string t;
    size_t r = q;
    auto is_base_digit = [&](size_t k) {
      if (k >= src_.size()) return false;
      const int c = lower(k);
      const int d = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : 99;
      return d < base;
    };
    if (base != 10) {
      while (true) {
        if (r < src_.size() && src_[r] == '_' && is_base_digit(r + 1)) ++r;
        if (!is_base_digit(r)) break;
        t.push_back(src_[r++]);
      }
      if (t.empty()) {  // "0" followed by a name: Jinja2 lexes the 0 alone
        base = 10;
        r = p + 1;
        t = "0";
      }
    } else if (src_[p] == '0') {
      t = "0";
      r = p + 1;
      while (true) {
        size_t k = r;
        if (k < src_.size() && src_[k] == '_') ++k;
        if (k < src_.size() && src_[k] == '0') {
          r = k + 1;
        } else {
          break;
        }
      }
    } else {
      r = digits(p);
      for (size_t k = p; k < r; ++k)
        if (src_[k] != '_') t.push_back(src_[k]);
    }
    emit(TK::kInt, src_.substr(p, r - p), p);
    int64_t v = 0;
    for (char c : t) {
      const int cl = std::tolower(static_cast<unsigned char>(c));
      const int d = (cl >= '0' && cl <= '9') ? cl - '0' : cl - 'a' + 10;
      if (__builtin_mul_overflow(v, int64_t{base}, &v) || __builtin_add_overflow(v, int64_t{d}, &v))
        not_supported(line_of(p), "an integer literal exceeds 64 bits");
    }
    tokens_.back().i = v;
    return r;
  }

  // A string literal with Python's escapes (Jinja2 decodes it with "unicode-escape").
  size_t string_literal(size_t p) {
    const char q = src_[p];
    std::string out;
    size_t k = p + 1;
    auto hex = [&](size_t at_k, int n) -> char32_t {
      char32_t v = 0;
      for (int d = 0; d < n; ++d) {
        const size_t idx = at_k + static_cast<size_t>(d);
        const int c = idx < src_.size() ? std::tolower(static_cast<unsigned char>(src_[idx])) : 0;
        int x = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : -1;
        if (x < 0) syntax_error(line_of(p), "truncated \\xXX escape in a string literal");
        v = v * 16 + static_cast<char32_t>(x);
      }
      return v;
    };
    while (true) {
      if (k >= src_.size()) syntax_error(line_of(p), "unexpected char '" + std::string(1, q) + "'");
      const char c = src_[k];
      if (c == q) break;
      if (c != '\\') {
        out.push_back(c);
        ++k;
        continue;
      }
      if (k + 1 >= src_.size()) syntax_error(line_of(p), "unexpected char '" + std::string(1, q) + "'");
      const char e = src_[k + 1];
      k += 2;
      switch (e) {
        case '\n': break;
        case '\\': out.push_back('\\'); break;
        case '\'': out.push_back('\''); break;
        case '"': out.push_back('"'); break;
        case 'a': out.push_back('\a'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'n': out.push_back('\n'); break;
        case 'r': out.push_back('\r'); break;
        case 't': out.push_back('\t'); break;
        case 'v': out.push_back('\v'); break;
        case 'x': append_utf8(out, hex(k, 2)); k += 2; break;
        case 'u': append_utf8(out, hex(k, 4)); k += 4; break;
        case 'U': {
          const char32_t v = hex(k, 8);
          if (v > 0x10FFFF) syntax_error(line_of(p), "illegal Unicode character in a string literal");
          append_utf8(out, v);
          k += 8;
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            char32_t v = static_cast<char32_t>(e - '0');
            for (int d = 0; d < 2 && k < src_.size() && src_[k] >= '0' && src_[k] <= '7'; ++d, ++k)
              v = v * 8 + static_cast<char32_t>(src_[k] - '0');
            append_utf8(out, v);
          } else if (e == 'N') {
            not_supported(line_of(p), "\\N{...} escapes in string literals");
          } else {
            out.push_back('\\');  // Python keeps an unknown escape as it is
            --k;
          }
      }
    }
    emit(TK::kString, std::move(out), p);
    return k + 1;
  }

  std::string src_;
  size_t pos_ = 0;
  size_t line_pos_ = 0;
  int line_ = 1;
  std::vector<Token> tokens_;
};

}  // namespace

// ---- filters and tests: declared here, defined with the evaluator -----------------------------

namespace {

const std::unordered_map<std::string, FilterFn>& filter_table();
const std::unordered_map<std::string, TestFn>& test_table();

// Jinja2's built-in filters this interpreter lacks: refused by name at parse time (an unknown
// name is Jinja2's own compile-time error).
const std::unordered_set<std::string>& missing_filters() {
  static const std::unordered_set<std::string> s = {
      "filesizeformat", "format", "groupby", "pprint",  "random",  "slice", "striptags",
      "truncate",       "urlencode", "urlize", "wordwrap", "xmlattr",
  };
  return s;
}

// ---- the parser ---------------------------------------------------------------------------

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : t_(std::move(tokens)) {}

  std::vector<Node> parse_template() {
    auto body = subparse({});
    return body;
  }

  bool has_generation = false;

 private:
  const Token& cur() const { return t_[i_]; }
  const Token& look() const { return t_[std::min(i_ + 1, t_.size() - 1)]; }
  const Token& next() { return t_[i_ < t_.size() - 1 ? i_++ : i_]; }
  bool is_op(const char* op) const { return cur().type == TK::kOp && cur().value == op; }
  bool is_name(const char* n) const { return cur().type == TK::kName && cur().value == n; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    ++i_;
    return true;
  }
  bool skip_name(const char* n) {
    if (!is_name(n)) return false;
    ++i_;
    return true;
  }
  static std::string describe(const Token& t) {
    switch (t.type) {
      case TK::kEof: return "end of template";
      case TK::kBlockEnd: return "end of statement block";
      case TK::kVarEnd: return "end of print statement";
      case TK::kBlockBegin: return "begin of statement block";
      case TK::kVarBegin: return "begin of print statement";
      case TK::kString: return "string";
      case TK::kInt: return "integer";
      case TK::kFloat: return "float";
      case TK::kData: return "template data";
      default: return "'" + t.value + "'";
    }
  }
  [[noreturn]] void unexpected(const std::string& expected) const {
    syntax_error(cur().line, "expected " + expected + ", got " + describe(cur()));
  }
  void expect_op(const char* op) {
    if (!skip_op(op)) unexpected(std::string("'") + op + "'");
  }
  std::string expect_name() {
    if (cur().type != TK::kName) unexpected("a name");
    return next().value;
  }
  void expect_block_end() {
    if (cur().type != TK::kBlockEnd) unexpected("end of statement block");
    ++i_;
  }

  struct Depth {
    explicit Depth(Parser& p) : p_(p) {
      if (++p_.depth_ > kMaxNesting) syntax_error(p_.cur().line, "the template nests too deeply");
    }
    ~Depth() { --p_.depth_; }
    Parser& p_;
  };

  // Template data and tags up to one of ends ({% name %} with name in ends, left unconsumed after
  // the block start) or the end of the template (only when ends is empty).
  std::vector<Node> subparse(const std::vector<std::string>& ends) {
    Depth d(*this);
    std::vector<Node> body;
    while (true) {
      const Token& tok = cur();
      if (tok.type == TK::kEof) {
        if (!ends.empty()) {
          std::string list;
          for (const auto& e : ends) list += (list.empty() ? "'" : " or '") + e + "'";
          syntax_error(tok.line, "unexpected end of template; Jinja was looking for the tag " + list);
        }
        return body;
      }
      if (tok.type == TK::kData) {
        Node n{NK::kText, tok.line};
        n.text = tok.value;
        body.push_back(std::move(n));
        ++i_;
      } else if (tok.type == TK::kVarBegin) {
        ++i_;
        Node n{NK::kOutput, tok.line};
        n.expr = parse_tuple(true, {}, false);
        if (cur().type != TK::kVarEnd) unexpected("end of print statement");
        ++i_;
        body.push_back(std::move(n));
      } else if (tok.type == TK::kBlockBegin) {
        ++i_;
        if (cur().type == TK::kName && std::find(ends.begin(), ends.end(), cur().value) != ends.end()) return body;
        statement(body);
      } else {
        syntax_error(tok.line, "unexpected " + describe(tok));
      }
    }
  }

  void statement(std::vector<Node>& body) {
    if (cur().type != TK::kName) syntax_error(cur().line, "tag name expected");
    const std::string tag = cur().value;
    const int line = cur().line;
    static const std::unordered_set<std::string> kRefused = {"extends", "block", "include", "import", "from",
                                                             "with",    "autoescape", "call"};
    if (kRefused.count(tag)) not_supported(line, "{% " + tag + " %} is not supported");
    ++i_;
    if (tag == "if") {
      body.push_back(parse_if(line));
    } else if (tag == "for") {
      body.push_back(parse_for(line));
    } else if (tag == "set") {
      body.push_back(parse_set(line));
    } else if (tag == "macro") {
      body.push_back(parse_macro(line));
    } else if (tag == "filter") {
      Node n{NK::kFilterBlock, line};
      n.filters = parse_filter_chain(true);
      expect_block_end();
      n.body = subparse({"endfilter"});
      ++i_;
      expect_block_end();
      body.push_back(std::move(n));
    } else if (tag == "print") {
      Node n{NK::kOutput, line};
      n.expr = parse_tuple(true, {}, false);
      expect_block_end();
      body.push_back(std::move(n));
    } else if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) syntax_error(line, "'" + tag + "' outside of a loop");
      expect_block_end();
      body.push_back(Node{tag == "break" ? NK::kBreak : NK::kContinue, line});
    } else if (tag == "generation") {
      has_generation = true;
      expect_block_end();
      Node n{NK::kGeneration, line};
      const int saved = loop_depth_;
      loop_depth_ = 0;  // the block is a call block: its body is a function of its own
      n.body = subparse({"endgeneration"});
      loop_depth_ = saved;
      ++i_;
      expect_block_end();
      body.push_back(std::move(n));
    } else {
      syntax_error(line, "Encountered unknown tag '" + tag + "'.");
    }
  }

  // An if with its elifs as a chain of ifs, each the else of the one before.
  Node parse_if(int line) {
    Node root{NK::kIf, line};
    Node* n = &root;
    while (true) {
      n->expr = parse_tuple(false, {}, false);
      expect_block_end();
      n->body = subparse({"elif", "else", "endif"});
      const Token& end = next();
      if (end.value == "elif") {
        n->else_body.push_back(Node{NK::kIf, end.line});
        n = &n->else_body.back();
        continue;
      }
      if (end.value == "else") {
        expect_block_end();
        n->else_body = subparse({"endif"});
        ++i_;
      }
      expect_block_end();
      return root;
    }
  }

  // Assignment targets: a name, or names separated by commas (optionally in parentheses).
  void parse_targets(Node& n, const char* end_name) {
    const bool paren = skip_op("(");
    while (true) {
      const int line = cur().line;
      std::string name = expect_name();
      static const std::unordered_set<std::string> kConst = {"true", "false", "none", "True", "False", "None"};
      if (kConst.count(name)) syntax_error(line, "can't assign to '" + name + "'");
      n.targets.push_back(std::move(name));
      if (!skip_op(",")) break;
      n.tuple_target = true;
      if ((paren && is_op(")")) || (!paren && end_name != nullptr && is_name(end_name)) || is_op("=")) break;
    }
    if (paren) {
      expect_op(")");
      n.tuple_target = n.tuple_target || n.targets.size() > 1;
    }
  }

  Node parse_for(int line) {
    Node n{NK::kFor, line};
    parse_targets(n, "in");
    if (!skip_name("in")) unexpected("'in'");
    n.expr = parse_tuple(false, {"recursive"}, false);
    if (skip_name("if")) n.cond = parse_expression(true);
    if (is_name("recursive")) not_supported(cur().line, "recursive for loops are not supported");
    expect_block_end();
    ++loop_depth_;
    n.body = subparse({"endfor", "else"});
    --loop_depth_;
    if (next().value == "else") {
      expect_block_end();
      n.else_body = subparse({"endfor"});
      ++i_;
    }
    expect_block_end();
    return n;
  }

  Node parse_set(int line) {
    if (cur().type == TK::kName && look().type == TK::kOp && look().value == ".") {
      Node n{NK::kSetNs, line};
      n.targets.push_back(next().value);
      ++i_;
      n.text = expect_name();
      expect_op("=");
      n.expr = parse_tuple(true, {}, false);
      expect_block_end();
      return n;
    }
    Node n{NK::kSet, line};
    parse_targets(n, nullptr);
    if (skip_op("=")) {
      n.expr = parse_tuple(true, {}, false);
      expect_block_end();
      return n;
    }
    if (n.tuple_target) unexpected("'='");
    n.kind = NK::kSetBlock;
    if (is_op("|")) n.filters = parse_filter_chain(false);
    expect_block_end();
    n.body = subparse({"endset"});
    ++i_;
    expect_block_end();
    return n;
  }

  Node parse_macro(int line) {
    Node n{NK::kMacro, line};
    n.text = expect_name();
    expect_op("(");
    while (!is_op(")")) {
      if (!n.targets.empty()) expect_op(",");
      if (is_op(")")) break;
      n.targets.push_back(expect_name());
      n.defaults.push_back(skip_op("=") ? parse_expression(true) : nullptr);
    }
    expect_op(")");
    expect_block_end();
    const int saved = loop_depth_;
    loop_depth_ = 0;
    const size_t first = i_;
    n.body = subparse({"endmacro"});
    loop_depth_ = saved;
    // A macro that reads varargs, kwargs or caller takes extra arguments in Jinja2: not done here.
    for (size_t k = first; k < i_; ++k) {
      if (t_[k].type == TK::kName && (t_[k].value == "varargs" || t_[k].value == "kwargs" || t_[k].value == "caller"))
        not_supported(t_[k].line, "macro '" + n.text + "' uses '" + t_[k].value + "' (not supported)");
    }
    ++i_;
    if (cur().type == TK::kName) ++i_;  // {% endmacro name %}
    expect_block_end();
    return n;
  }

  // Filters of a {% filter %} block (first without "|") or a block set (each after "|").
  std::vector<ExprPtr> parse_filter_chain(bool start_inline) {
    std::vector<ExprPtr> chain;
    bool first = true;
    while (first ? (start_inline || is_op("|")) : is_op("|")) {
      if (!(first && start_inline)) expect_op("|");
      first = false;
      chain.push_back(parse_filter_call(nullptr));
    }
    return chain;
  }

  // ---- expressions ----

  ExprPtr make(EK kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }

  bool tuple_end(const std::vector<std::string>& extra) const {
    if (cur().type == TK::kVarEnd || cur().type == TK::kBlockEnd || is_op(")")) return true;
    return cur().type == TK::kName && std::find(extra.begin(), extra.end(), cur().value) != extra.end();
  }

  ExprPtr parse_tuple(bool with_condexpr, const std::vector<std::string>& extra, bool explicit_parens) {
    const int line = cur().line;
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) expect_op(",");
      if (tuple_end(extra)) break;
      items.push_back(parse_expression(with_condexpr));
      if (is_op(",")) {
        is_tuple = true;
      } else {
        break;
      }
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_parens) unexpected("an expression");
    }
    auto e = make(EK::kTuple, line);
    e->args = std::move(items);
    return e;
  }

  ExprPtr parse_expression(bool with_condexpr) {
    Depth d(*this);
    return with_condexpr ? parse_condexpr() : parse_or();
  }

  ExprPtr parse_condexpr() {
    ExprPtr e = parse_or();
    while (is_name("if")) {
      const int line = next().line;
      auto c = make(EK::kCond, line);
      ExprPtr cond = parse_or();
      ExprPtr other = skip_name("else") ? parse_condexpr() : nullptr;
      c->args.push_back(std::move(cond));
      c->args.push_back(std::move(e));
      c->args.push_back(std::move(other));
      e = std::move(c);
    }
    return e;
  }

  // `a word b word c`, left to right: `or` over `and` over `not`.
  ExprPtr parse_logical(const char* word, EK kind, ExprPtr (Parser::*operand)()) {
    ExprPtr e = (this->*operand)();
    while (is_name(word)) {
      auto o = make(kind, next().line);
      o->args.push_back(std::move(e));
      o->args.push_back((this->*operand)());
      e = std::move(o);
    }
    return e;
  }
  ExprPtr parse_or() { return parse_logical("or", EK::kOr, &Parser::parse_and); }
  ExprPtr parse_and() { return parse_logical("and", EK::kAnd, &Parser::parse_not); }

  ExprPtr parse_not() {
    if (is_name("not")) {
      Depth d(*this);
      auto o = make(EK::kNot, next().line);
      o->args.push_back(parse_not());
      return o;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    const int line = cur().line;
    ExprPtr first = parse_math1();
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (cur().type == TK::kOp &&
          (cur().value == "==" || cur().value == "!=" || cur().value == "<" || cur().value == ">" ||
           cur().value == "<=" || cur().value == ">=")) {
        op = next().value;
      } else if (skip_name("in")) {
        op = "in";
      } else if (is_name("not") && look().type == TK::kName && look().value == "in") {
        i_ += 2;
        op = "not in";
      } else {
        break;
      }
      if (!cmp) {
        cmp = make(EK::kCompare, line);
        cmp->args.push_back(std::move(first));
      }
      cmp->ops.push_back(op);
      cmp->args.push_back(parse_math1());
    }
    return cmp ? std::move(cmp) : std::move(first);
  }

  ExprPtr binary_node(const std::string& op, ExprPtr a, ExprPtr b, int line) {
    auto e = make(EK::kBinary, line);
    e->name = op;
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return e;
  }

  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token& t = next();
      e = binary_node(t.value, std::move(e), parse_concat(), t.line);
    }
    return e;
  }

  ExprPtr parse_concat() {
    ExprPtr e = parse_math2();
    if (!is_op("~")) return e;
    auto c = make(EK::kConcat, cur().line);
    c->args.push_back(std::move(e));
    while (skip_op("~")) c->args.push_back(parse_math2());
    return c;
  }

  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& t = next();
      e = binary_node(t.value, std::move(e), parse_pow(), t.line);
    }
    return e;
  }

  ExprPtr parse_pow() {
    ExprPtr e = parse_unary(true);
    while (is_op("**")) {
      const Token& t = next();
      e = binary_node("**", std::move(e), parse_unary(true), t.line);
    }
    return e;
  }

  ExprPtr parse_unary(bool with_filter) {
    Depth d(*this);
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      const Token& t = next();
      e = make(t.value == "-" ? EK::kNeg : EK::kPos, t.line);
      e->args.push_back(parse_unary(false));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_expr(std::move(e));
    return e;
  }

  ExprPtr parse_primary() {
    const Token& t = cur();
    const int line = t.line;
    if (t.type == TK::kName) {
      ++i_;
      if (t.value == "true" || t.value == "True" || t.value == "false" || t.value == "False") {
        auto e = make(EK::kConst, line);
        e->value = Value::boolean(t.value == "true" || t.value == "True");
        return e;
      }
      if (t.value == "none" || t.value == "None") {
        auto e = make(EK::kConst, line);
        e->value = Value::none();
        return e;
      }
      auto e = make(EK::kName, line);
      e->name = t.value;
      return e;
    }
    if (t.type == TK::kString) {
      std::string s;
      while (cur().type == TK::kString) s.append(next().value);
      auto e = make(EK::kConst, line);
      e->value = Value::str(std::move(s));
      return e;
    }
    if (t.type == TK::kInt || t.type == TK::kFloat) {
      ++i_;
      auto e = make(EK::kConst, line);
      e->value = t.type == TK::kInt ? Value::integer(t.i) : Value::number(t.f);
      return e;
    }
    if (skip_op("(")) {
      ExprPtr e = parse_tuple(true, {}, true);
      expect_op(")");
      return e;
    }
    if (skip_op("[")) {
      auto e = make(EK::kList, line);
      while (!is_op("]")) {
        if (!e->args.empty()) expect_op(",");
        if (is_op("]")) break;
        e->args.push_back(parse_expression(true));
      }
      expect_op("]");
      return e;
    }
    if (skip_op("{")) {
      auto e = make(EK::kDict, line);
      while (!is_op("}")) {
        if (!e->args.empty()) expect_op(",");
        if (is_op("}")) break;
        ExprPtr key = parse_expression(true);
        expect_op(":");
        e->args.push_back(std::move(key));
        e->args.push_back(parse_expression(true));
      }
      expect_op("}");
      return e;
    }
    syntax_error(line, "unexpected " + describe(t));
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      if (is_op(".") || is_op("[")) {
        e = parse_subscript(std::move(e));
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_filter_expr(ExprPtr e) {
    while (true) {
      if (is_op("|")) {
        ++i_;
        e = parse_filter_call(std::move(e));
      } else if (is_name("is")) {
        e = parse_test(std::move(e));
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr obj) {
    const Token& t = next();
    if (t.value == ".") {
      const Token& a = cur();
      if (a.type == TK::kName) {
        auto e = make(EK::kGetattr, a.line);
        e->name = next().value;
        e->args.push_back(std::move(obj));
        return e;
      }
      if (a.type != TK::kInt) unexpected("name or number");
      auto e = make(EK::kGetitem, a.line);
      auto idx = make(EK::kConst, a.line);
      idx->value = Value::integer(next().i);
      e->args.push_back(std::move(obj));
      e->args.push_back(std::move(idx));
      return e;
    }
    // "[": an index or a slice; Jinja2 also takes a tuple of them, which no dict key here could match.
    const int line = t.line;
    ExprPtr e;
    ExprPtr start;
    if (!is_op(":")) {
      start = parse_expression(true);
      if (!is_op(":")) {
        if (is_op(",")) not_supported(line, "tuple subscripts (x[a, b]) are not supported");
        expect_op("]");
        e = make(EK::kGetitem, line);
        e->args.push_back(std::move(obj));
        e->args.push_back(std::move(start));
        return e;
      }
    }
    expect_op(":");
    e = make(EK::kSlice, line);
    e->args.push_back(std::move(obj));
    e->args.push_back(std::move(start));
    e->args.push_back(is_op("]") || is_op(",") || is_op(":") ? nullptr : parse_expression(true));
    if (skip_op(":")) {
      e->args.push_back(is_op("]") || is_op(",") ? nullptr : parse_expression(true));
    } else {
      e->args.push_back(nullptr);
    }
    if (is_op(",")) not_supported(line, "tuple subscripts (x[a:b, c]) are not supported");
    expect_op("]");
    return e;
  }

  // "(" args ")" into e's args (after whatever is there) and kwargs.
  void parse_call_args(Expr& e) {
    expect_op("(");
    bool comma = false;
    while (!is_op(")")) {
      if (comma) {
        expect_op(",");
        if (is_op(")")) break;
      }
      if (is_op("*") || is_op("**")) not_supported(cur().line, "*args and **kwargs in calls are not supported");
      if (cur().type == TK::kName && look().type == TK::kOp && look().value == "=") {
        std::string key = next().value;
        ++i_;
        e.kwargs.emplace_back(std::move(key), parse_expression(true));
      } else {
        if (!e.kwargs.empty()) syntax_error(cur().line, "invalid syntax for function call expression");
        e.args.push_back(parse_expression(true));
      }
      comma = true;
    }
    expect_op(")");
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto e = make(EK::kCall, cur().line);
    e->args.push_back(std::move(callee));
    parse_call_args(*e);
    return e;
  }

  ExprPtr parse_filter_call(ExprPtr subject) {
    const int line = cur().line;
    std::string name = expect_name();
    while (skip_op(".")) {
      name.push_back('.');
      name.append(expect_name());
    }
    auto e = make(EK::kFilter, line);
    e->name = name;
    const auto& table = filter_table();
    auto it = table.find(name);
    if (it == table.end()) {
      if (missing_filters().count(name)) not_supported(line, "the filter '" + name + "' is not supported");
      syntax_error(line, "No filter named '" + name + "'.");
    }
    e->filter = it->second;
    e->args.push_back(std::move(subject));
    if (is_op("(")) parse_call_args(*e);
    return e;
  }

  ExprPtr parse_test(ExprPtr subject) {
    const int line = next().line;  // "is"
    auto e = make(EK::kTest, line);
    e->negated = skip_name("not");
    std::string name = expect_name();
    while (skip_op(".")) {
      name.push_back('.');
      name.append(expect_name());
    }
    e->name = name;
    const auto& table = test_table();
    auto it = table.find(name);
    if (it == table.end()) {
      if (name == "escaped") not_supported(line, "the test 'escaped' is not supported");
      syntax_error(line, "No test named '" + name + "'.");
    }
    e->test = it->second;
    e->args.push_back(std::move(subject));
    if (is_op("(")) {
      parse_call_args(*e);
    } else if ((cur().type == TK::kName || cur().type == TK::kString || cur().type == TK::kInt ||
                cur().type == TK::kFloat || is_op("(") || is_op("[") || is_op("{")) &&
               !is_name("else") && !is_name("or") && !is_name("and")) {
      if (is_name("is")) syntax_error(cur().line, "You cannot chain multiple tests with is");
      e->args.push_back(parse_postfix(parse_primary()));
    }
    return e;
  }

  std::vector<Token> t_;
  size_t i_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

// ---- the evaluator --------------------------------------------------------------------------

namespace {

struct Scope {
  std::shared_ptr<Scope> parent;
  std::vector<std::pair<std::string, Value>> vars;
  const Value* find(const std::string& name) const {
    for (const Scope* s = this; s != nullptr; s = s->parent.get())
      for (const auto& [k, v] : s->vars)
        if (k == name) return &v;
    return nullptr;
  }
  void set(const std::string& name, Value v) {
    for (auto& [k, old] : vars) {
      if (k == name) {
        old = std::move(v);
        return;
      }
    }
    vars.emplace_back(name, std::move(v));
  }
};
using ScopePtr = std::shared_ptr<Scope>;

std::shared_ptr<Scope> child(const ScopePtr& parent) {
  auto s = std::make_shared<Scope>();
  s->parent = parent;
  return s;
}

enum class Flow : uint8_t { kNormal, kBreak, kContinue };

// Parameter k of a Python signature, given by position or by name; nullptr when absent.
const Value* param(const Args& a, size_t k, const char* name) {
  if (k < a.pos.size()) return &a.pos[k];
  for (const auto& [n, v] : a.kw)
    if (n == name) return &v;
  return nullptr;
}

// Checks a call against a signature: at most params.size() positional arguments, keywords among
// params and not given twice.
void signature(const Args& a, const std::string& fn, std::initializer_list<const char*> params) {
  if (a.pos.size() > params.size())
    fail(fn + "() takes at most " + std::to_string(params.size()) + " argument(s) (" + std::to_string(a.pos.size()) +
         " given)");
  for (const auto& [n, v] : a.kw) {
    size_t k = 0;
    bool found = false;
    for (const char* p : params) {
      if (n == p) {
        found = true;
        if (k < a.pos.size()) fail(fn + "() got multiple values for argument '" + n + "'");
      }
      ++k;
    }
    if (!found) fail(fn + "() got an unexpected keyword argument '" + n + "'");
  }
}

std::string str_param(const Args& a, size_t k, const char* name, const std::string& fn) {
  const Value* v = param(a, k, name);
  if (v == nullptr) fail(fn + "() missing required argument '" + name + "'");
  if (v->type != Type::kString) fail(fn + "() argument '" + name + "' must be str, not " + type_name(*v));
  return v->s;
}

int64_t int_param(const Args& a, size_t k, const char* name, int64_t dflt, const std::string& fn) {
  const Value* v = param(a, k, name);
  if (v == nullptr || v->type == Type::kNone) return dflt;
  if (!v->is_int()) fail(fn + "() argument '" + name + "' must be an integer, not " + type_name(*v));
  return v->as_int();
}

bool bool_param(const Args& a, size_t k, const char* name, bool dflt) {
  const Value* v = param(a, k, name);
  return v == nullptr ? dflt : truthy(*v);
}

// A bound method of a str, list or dict: fn(self, args).
using Method = Value (*)(const Value&, Args&);

Value bind(const std::string& name, const Value& self, Method m) {
  return make_callable(name, [self, m](Args& a) { return m(self, a); });
}

Value unsafe_attribute(const Value& obj, const std::string& name) {
  Value u = Value::undefined("access to attribute '" + name + "' of '" + type_name(obj) + "' object is unsafe.");
  u.unsafe = true;
  return u;
}

Value tuple_of(List items) { return Value::make_list(std::move(items), Seq::kTuple); }

bool starts_or_ends(const Value& self, Args& a, bool starts, const char* fn) {
  signature(a, fn, {"prefix", "start", "end"});
  const Value* p = param(a, 0, "prefix");
  if (p == nullptr) fail(std::string(fn) + "() takes at least 1 argument (0 given)");
  std::string_view s = self.s;
  const int64_t start = int_param(a, 1, "start", 0, fn);
  if (start != 0) {
    const std::u32string u = to_u32(s);
    const int64_t n = static_cast<int64_t>(u.size());
    int64_t b = start < 0 ? std::max<int64_t>(0, start + n) : std::min(start, n);
    const std::string rest = to_utf8(std::u32string_view(u).substr(static_cast<size_t>(b)));
    Value sub = Value::str(rest);
    Args a2;
    a2.pos.push_back(*p);
    return starts_or_ends(sub, a2, starts, fn);
  }
  auto one = [&](const Value& x) {
    if (x.type != Type::kString) fail(std::string(fn) + " first arg must be str or a tuple of str, not " + type_name(x));
    if (x.s.size() > s.size()) return false;
    return starts ? s.substr(0, x.s.size()) == x.s : s.substr(s.size() - x.s.size()) == x.s;
  };
  if (p->type == Type::kList && p->seq == Seq::kTuple) {
    for (const Value& x : *p->list)
      if (one(x)) return true;
    return false;
  }
  return one(*p);
}

Value find_method(const Value& self, Args& a, bool reverse, bool raise, const char* fn) {
  signature(a, fn, {"sub", "start", "end"});
  const std::string sub = str_param(a, 0, "sub", fn);
  const std::u32string u = to_u32(self.s);
  const int64_t n = static_cast<int64_t>(u.size());
  auto norm = [n](int64_t x) { return x < 0 ? std::max<int64_t>(0, x + n) : std::min(x, n); };
  const int64_t b = norm(int_param(a, 1, "start", 0, fn));
  const int64_t e = norm(int_param(a, 2, "end", n, fn));
  int64_t found = -1;
  if (b <= e) {
    const std::u32string usub = to_u32(sub);
    const std::u32string_view hay = std::u32string_view(u).substr(static_cast<size_t>(b), static_cast<size_t>(e - b));
    const size_t k = reverse ? hay.rfind(usub) : hay.find(usub);
    if (k != std::u32string_view::npos) found = b + static_cast<int64_t>(k);
  }
  if (found < 0 && raise) fail("substring not found");
  return Value::integer(found);
}

std::string pad(const std::string& s, int64_t width, const std::string& fill, int where) {
  const int64_t n = static_cast<int64_t>(u32_length(s));
  if (width <= n) return s;
  const int64_t marg = width - n;
  int64_t left = where < 0 ? 0 : where > 0 ? marg : marg / 2 + (marg & width & 1);
  std::string out;
  for (int64_t k = 0; k < left; ++k) out.append(fill);
  out.append(s);
  for (int64_t k = 0; k < marg - left; ++k) out.append(fill);
  return out;
}

std::string fill_char(const Args& a, size_t k, const char* fn) {
  const Value* f = param(a, k, "fillchar");
  if (f == nullptr) return " ";
  if (f->type != Type::kString || u32_length(f->s) != 1)
    fail(std::string(fn) + "() the fill character must be exactly one character long");
  return f->s;
}

const std::unordered_map<std::string, Method>& str_methods() {
  static const std::unordered_map<std::string, Method> m = {
      {"strip", [](const Value& s, Args& a) { signature(a, "strip", {"chars"}); return Value::str(py_strip(s.s, param(a, 0, "chars"), true, true)); }},
      {"lstrip", [](const Value& s, Args& a) { signature(a, "lstrip", {"chars"}); return Value::str(py_strip(s.s, param(a, 0, "chars"), true, false)); }},
      {"rstrip", [](const Value& s, Args& a) { signature(a, "rstrip", {"chars"}); return Value::str(py_strip(s.s, param(a, 0, "chars"), false, true)); }},
      {"split", [](const Value& s, Args& a) {
         signature(a, "split", {"sep", "maxsplit"});
         return Value::make_list(py_split(s.s, param(a, 0, "sep"), int_param(a, 1, "maxsplit", -1, "split")));
       }},
      {"rsplit", [](const Value& s, Args& a) {
         signature(a, "rsplit", {"sep", "maxsplit"});
         const int64_t maxsplit = int_param(a, 1, "maxsplit", -1, "rsplit");
         const Value* sep = param(a, 0, "sep");
         if (maxsplit < 0) return Value::make_list(py_split(s.s, sep, -1));
         // From the right: split the reversed text by the reversed separator.
         std::u32string u = to_u32(s.s);
         std::reverse(u.begin(), u.end());
         Value rsep;
         if (sep != nullptr && sep->type == Type::kString) {
           std::u32string us = to_u32(sep->s);
           std::reverse(us.begin(), us.end());
           rsep = Value::str(to_utf8(us));
         } else if (sep != nullptr) {
           rsep = *sep;
         }
         List parts = py_split(to_utf8(u), sep == nullptr ? nullptr : &rsep, maxsplit);
         std::reverse(parts.begin(), parts.end());
         for (Value& p : parts) {
           std::u32string up = to_u32(p.s);
           std::reverse(up.begin(), up.end());
           p.s = to_utf8(up);
         }
         return Value::make_list(std::move(parts));
       }},
      {"splitlines", [](const Value& s, Args& a) {
         signature(a, "splitlines", {"keepends"});
         List out;
         for (auto& line : py_splitlines(s.s, bool_param(a, 0, "keepends", false))) out.push_back(Value::str(line));
         return Value::make_list(std::move(out));
       }},
      {"startswith", [](const Value& s, Args& a) { return Value::boolean(starts_or_ends(s, a, true, "startswith")); }},
      {"endswith", [](const Value& s, Args& a) { return Value::boolean(starts_or_ends(s, a, false, "endswith")); }},
      {"upper", [](const Value& s, Args& a) { signature(a, "upper", {}); return Value::str(upper_str(s.s)); }},
      {"lower", [](const Value& s, Args& a) { signature(a, "lower", {}); return Value::str(lower_str(s.s)); }},
      {"title", [](const Value& s, Args& a) { signature(a, "title", {}); return Value::str(py_title(s.s)); }},
      {"capitalize", [](const Value& s, Args& a) { signature(a, "capitalize", {}); return Value::str(py_capitalize(s.s)); }},
      {"replace", [](const Value& s, Args& a) {
         signature(a, "replace", {"old", "new", "count"});
         return Value::str(py_replace(s.s, str_param(a, 0, "old", "replace"), str_param(a, 1, "new", "replace"),
                                      int_param(a, 2, "count", -1, "replace")));
       }},
      {"find", [](const Value& s, Args& a) { return find_method(s, a, false, false, "find"); }},
      {"rfind", [](const Value& s, Args& a) { return find_method(s, a, true, false, "rfind"); }},
      {"index", [](const Value& s, Args& a) { return find_method(s, a, false, true, "index"); }},
      {"rindex", [](const Value& s, Args& a) { return find_method(s, a, true, true, "rindex"); }},
      {"count", [](const Value& s, Args& a) {
         signature(a, "count", {"sub"});
         const std::string sub = str_param(a, 0, "sub", "count");
         if (sub.empty()) return Value::integer(static_cast<int64_t>(u32_length(s.s)) + 1);
         int64_t n = 0;
         for (size_t p = s.s.find(sub); p != std::string::npos; p = s.s.find(sub, p + sub.size())) ++n;
         return Value::integer(n);
       }},
      {"join", [](const Value& s, Args& a) {
         signature(a, "join", {"iterable"});
         const Value* it = param(a, 0, "iterable");
         if (it == nullptr) fail("join() takes exactly one argument (0 given)");
         std::string out;
         bool first = true;
         const auto held_x = iterate(*it);  // holds the items while the loop runs
         for (const Value& x : *held_x) {
           if (x.type != Type::kString) fail("sequence item: expected str instance, " + type_name(x) + " found");
           if (!first) out.append(s.s);
           first = false;
           out.append(x.s);
           check_size(out.size());
         }
         return Value::str(std::move(out));
       }},
      {"isdigit", [](const Value& s, Args&) {
         const auto u = to_u32(s.s);
         return Value::boolean(!u.empty() && std::all_of(u.begin(), u.end(), is_digit));
       }},
      {"isdecimal", [](const Value& s, Args&) {
         const auto u = to_u32(s.s);
         return Value::boolean(!u.empty() && std::all_of(u.begin(), u.end(), is_digit));
       }},
      {"isnumeric", [](const Value& s, Args&) {
         const auto u = to_u32(s.s);
         return Value::boolean(!u.empty() && std::all_of(u.begin(), u.end(), is_numeric));
       }},
      {"isalpha", [](const Value& s, Args&) {
         const auto u = to_u32(s.s);
         return Value::boolean(!u.empty() && std::all_of(u.begin(), u.end(), is_alpha));
       }},
      {"isalnum", [](const Value& s, Args&) {
         const auto u = to_u32(s.s);
         return Value::boolean(!u.empty() && std::all_of(u.begin(), u.end(), [](char32_t c) { return is_alpha(c) || is_numeric(c); }));
       }},
      {"isspace", [](const Value& s, Args&) {
         const auto u = to_u32(s.s);
         return Value::boolean(!u.empty() && std::all_of(u.begin(), u.end(), is_space));
       }},
      {"islower", [](const Value& s, Args&) { return Value::boolean(py_islower(s.s)); }},
      {"isupper", [](const Value& s, Args&) { return Value::boolean(py_isupper(s.s)); }},
      {"removeprefix", [](const Value& s, Args& a) {
         signature(a, "removeprefix", {"prefix"});
         const std::string p = str_param(a, 0, "prefix", "removeprefix");
         return Value::str(s.s.compare(0, p.size(), p) == 0 ? s.s.substr(p.size()) : s.s);
       }},
      {"removesuffix", [](const Value& s, Args& a) {
         signature(a, "removesuffix", {"suffix"});
         const std::string p = str_param(a, 0, "suffix", "removesuffix");
         const bool ends = !p.empty() && s.s.size() >= p.size() && s.s.compare(s.s.size() - p.size(), p.size(), p) == 0;
         return Value::str(ends ? s.s.substr(0, s.s.size() - p.size()) : s.s);
       }},
      {"center", [](const Value& s, Args& a) {
         signature(a, "center", {"width", "fillchar"});
         return Value::str(pad(s.s, int_param(a, 0, "width", 0, "center"), fill_char(a, 1, "center"), 0));
       }},
      {"ljust", [](const Value& s, Args& a) {
         signature(a, "ljust", {"width", "fillchar"});
         return Value::str(pad(s.s, int_param(a, 0, "width", 0, "ljust"), fill_char(a, 1, "ljust"), -1));
       }},
      {"rjust", [](const Value& s, Args& a) {
         signature(a, "rjust", {"width", "fillchar"});
         return Value::str(pad(s.s, int_param(a, 0, "width", 0, "rjust"), fill_char(a, 1, "rjust"), 1));
       }},
  };
  return m;
}

// Python str methods not implemented here: a call to one fails by name rather than as "undefined".
const std::unordered_set<std::string>& missing_str_methods() {
  static const std::unordered_set<std::string> s = {
      "casefold", "encode", "expandtabs", "format", "format_map", "isascii", "isidentifier", "isprintable",
      "istitle", "maketrans", "partition", "rpartition", "swapcase", "translate", "zfill",
  };
  return s;
}

const std::unordered_map<std::string, Method>& dict_methods() {
  static const std::unordered_map<std::string, Method> m = {
      {"get", [](const Value& d, Args& a) {
         signature(a, "get", {"key", "default"});
         const Value* k = param(a, 0, "key");
         if (k == nullptr) fail("get expected at least 1 argument, got 0");
         const Value* dflt = param(a, 1, "default");
         if (k->type == Type::kString)
           if (const Value* v = d.dict->find(k->s)) return *v;
         return dflt ? *dflt : Value::none();
       }},
      {"items", [](const Value& d, Args& a) {
         signature(a, "items", {});
         List out;
         for (const auto& [k, v] : d.dict->items) out.push_back(tuple_of({Value::str(k), v}));
         return Value::make_list(std::move(out), Seq::kItems);
       }},
      {"keys", [](const Value& d, Args& a) {
         signature(a, "keys", {});
         List out;
         for (const auto& kv : d.dict->items) out.push_back(Value::str(kv.first));
         return Value::make_list(std::move(out), Seq::kKeys);
       }},
      {"values", [](const Value& d, Args& a) {
         signature(a, "values", {});
         List out;
         for (const auto& kv : d.dict->items) out.push_back(kv.second);
         return Value::make_list(std::move(out), Seq::kValues);
       }},
      {"copy", [](const Value& d, Args& a) {
         signature(a, "copy", {});
         return Value::make_dict(std::make_shared<Dict>(*d.dict));
       }},
  };
  return m;
}

const std::unordered_map<std::string, Method>& list_methods() {
  static const std::unordered_map<std::string, Method> m = {
      {"index", [](const Value& l, Args& a) {
         signature(a, "index", {"value"});
         const Value* x = param(a, 0, "value");
         if (x == nullptr) fail("index expected at least 1 argument, got 0");
         for (size_t k = 0; k < l.list->size(); ++k)
           if (py_eq((*l.list)[k], *x)) return Value::integer(static_cast<int64_t>(k));
         fail("value is not in list");
       }},
      {"count", [](const Value& l, Args& a) {
         signature(a, "count", {"value"});
         const Value* x = param(a, 0, "value");
         if (x == nullptr) fail("count() takes exactly one argument (0 given)");
         int64_t n = 0;
         for (const Value& y : *l.list) n += py_eq(y, *x) ? 1 : 0;
         return Value::integer(n);
       }},
      {"copy", [](const Value& l, Args& a) {
         signature(a, "copy", {});
         return Value::make_list(*l.list, l.seq);
       }},
  };
  return m;
}

bool is_mutating(Type t, const std::string& name) {
  static const std::unordered_set<std::string> kList = {"append", "clear", "extend", "insert", "pop", "remove",
                                                         "reverse", "sort"};
  static const std::unordered_set<std::string> kDict = {"clear", "pop", "popitem", "setdefault", "update"};
  return t == Type::kList ? kList.count(name) > 0 : t == Type::kDict ? kDict.count(name) > 0 : false;
}

std::string no_attribute(const Value& obj, const std::string& name) {
  return "'" + type_name(obj) + " object' has no attribute '" + name + "'";
}

// Python's getattr(obj, name) through the sandbox: methods (the mutating ones refused), a
// namespace's or the loop's attributes; nullopt where Python has no such attribute.
std::optional<Value> py_getattr(const Value& obj, const std::string& name) {
  switch (obj.type) {
    case Type::kString: {
      auto it = str_methods().find(name);
      if (it != str_methods().end()) return bind(name, obj, it->second);
      if (missing_str_methods().count(name)) {
        Value u = Value::undefined("the str method '" + name + "' is not supported by this interpreter");
        u.unsafe = true;
        return u;
      }
      return std::nullopt;
    }
    case Type::kDict: {
      auto it = dict_methods().find(name);
      if (it != dict_methods().end()) return bind(name, obj, it->second);
      if (is_mutating(Type::kDict, name)) return unsafe_attribute(obj, name);
      return std::nullopt;
    }
    case Type::kList: {
      if (obj.seq == Seq::kList || obj.seq == Seq::kTuple) {
        if (is_mutating(Type::kList, name) && obj.seq == Seq::kList) return unsafe_attribute(obj, name);
        auto it = list_methods().find(name);
        if (it != list_methods().end() && (name != "copy" || obj.seq == Seq::kList)) return bind(name, obj, it->second);
      }
      return std::nullopt;
    }
    case Type::kNamespace: {
      if (const Value* v = obj.dict->find(name)) return *v;
      return std::nullopt;
    }
    case Type::kLoop: {
      const LoopState& l = *obj.loop;
      const int64_t n = static_cast<int64_t>(l.items->size()), k = static_cast<int64_t>(l.index);
      if (name == "index") return Value::integer(k + 1);
      if (name == "index0") return Value::integer(k);
      if (name == "revindex") return Value::integer(n - k);
      if (name == "revindex0") return Value::integer(n - k - 1);
      if (name == "first") return Value::boolean(k == 0);
      if (name == "last") return Value::boolean(k == n - 1);
      if (name == "length") return Value::integer(n);
      if (name == "depth") return Value::integer(1);
      if (name == "depth0") return Value::integer(0);
      if (name == "previtem")
        return k > 0 ? (*l.items)[static_cast<size_t>(k - 1)] : Value::undefined("there is no previous item");
      if (name == "nextitem")
        return k + 1 < n ? (*l.items)[static_cast<size_t>(k + 1)] : Value::undefined("there is no next item");
      if (name == "cycle") {
        auto st = obj.loop;
        return make_callable("cycle", [st](Args& a) -> Value {
          if (!a.kw.empty()) fail("cycle() takes no keyword arguments");
          if (a.pos.empty()) fail("no items for cycling given");
          return a.pos[st->index % a.pos.size()];
        });
      }
      if (name == "changed") {
        auto st = obj.loop;
        return make_callable("changed", [st](Args& a) -> Value {
          if (st->last_changed) {
            bool same = st->last_changed->size() == a.pos.size();
            for (size_t k2 = 0; same && k2 < a.pos.size(); ++k2) same = py_eq((*st->last_changed)[k2], a.pos[k2]);
            if (same) return Value::boolean(false);
          }
          st->last_changed = a.pos;
          return Value::boolean(true);
        });
      }
      return std::nullopt;
    }
    default:
      return std::nullopt;
  }
}

// x.name in a template (Jinja2's Environment.getattr): the attribute, else the item.
Value get_attribute(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) undefined_error(obj);
  if (auto v = py_getattr(obj, name)) return *v;
  if (obj.type == Type::kDict)
    if (const Value* v = obj.dict->find(name)) return *v;
  if (obj.type == Type::kNone) return Value::undefined("'None' has no attribute '" + name + "'");
  return Value::undefined(no_attribute(obj, name));
}

// x[key] in a template (Jinja2's Environment.getitem): the item, else the attribute named key.
Value get_item(const Value& obj, const Value& key) {
  if (obj.is_undefined()) undefined_error(obj);
  if (obj.type == Type::kDict && key.type == Type::kString) {
    if (const Value* v = obj.dict->find(key.s)) return *v;
  } else if (key.is_int() && (obj.type == Type::kString || (obj.type == Type::kList && obj.seq != Seq::kIterator &&
                                                             obj.seq != Seq::kKeys && obj.seq != Seq::kValues &&
                                                             obj.seq != Seq::kItems))) {
    int64_t k = key.as_int();
    if (obj.type == Type::kString) {
      const std::u32string u = to_u32(obj.s);
      const int64_t n = static_cast<int64_t>(u.size());
      if (k < 0) k += n;
      if (k >= 0 && k < n) return Value::str(to_utf8(std::u32string_view(u).substr(static_cast<size_t>(k), 1)));
      return Value::undefined("string index out of range");
    }
    const int64_t n = static_cast<int64_t>(obj.list->size());
    if (k < 0) k += n;
    if (k >= 0 && k < n) return (*obj.list)[static_cast<size_t>(k)];
    return Value::undefined(type_name(obj) + " object has no element " + std::to_string(key.as_int()));
  }
  if (key.type == Type::kString) {
    if (auto v = py_getattr(obj, key.s)) return *v;
    return Value::undefined(no_attribute(obj, key.s));
  }
  std::string k;
  repr(key, k, 0);
  return Value::undefined("'" + type_name(obj) + " object' has no element " + k);
}

Value get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step) {
  if (obj.is_undefined()) undefined_error(obj);
  if (obj.type == Type::kString) {
    const std::u32string u = to_u32(obj.s);
    std::u32string r;
    for (size_t k : slice_indices(static_cast<int64_t>(u.size()), start, stop, step)) r.push_back(u[k]);
    return Value::str(to_utf8(r));
  }
  if (obj.type == Type::kList && (obj.seq == Seq::kList || obj.seq == Seq::kTuple || obj.seq == Seq::kRange)) {
    List r;
    for (size_t k : slice_indices(static_cast<int64_t>(obj.list->size()), start, stop, step))
      r.push_back((*obj.list)[k]);
    return Value::make_list(std::move(r), obj.seq == Seq::kTuple ? Seq::kTuple : Seq::kList);
  }
  return Value::undefined("'" + type_name(obj) + "' object is not subscriptable");
}

Value from_json(const json& j, int depth) {
  if (depth > 512) throw Error(ErrorKind::kInvalidArgument, "chat template: the context nests deeper than 512");
  switch (j.type()) {
    case json::value_t::null: return Value::none();
    case json::value_t::boolean: return Value::boolean(j.get<bool>());
    case json::value_t::number_integer: return Value::integer(j.get<int64_t>());
    case json::value_t::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX))
        throw Error(ErrorKind::kNotSupported, "chat template: the context has an integer above 2^63");
      return Value::integer(static_cast<int64_t>(u));
    }
    case json::value_t::number_float: return Value::number(j.get<double>());
    case json::value_t::string: return Value::str(j.get<std::string>());
    case json::value_t::array: {
      List l;
      l.reserve(j.size());
      for (const json& x : j) l.push_back(from_json(x, depth + 1));
      return Value::make_list(std::move(l));
    }
    case json::value_t::object: {
      auto d = std::make_shared<Dict>();
      d->items.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it) d->items.emplace_back(it.key(), from_json(it.value(), depth + 1));
      return Value::make_dict(std::move(d));
    }
    default:
      throw Error(ErrorKind::kInvalidArgument, "chat template: the context holds a binary JSON value");
  }
}

}  // namespace

namespace {

struct Renderer {
  const Dict* context = nullptr;
  const std::string* top = nullptr;  // the final text: generation spans are offsets into it
  std::vector<std::pair<size_t, size_t>> generation;
  std::vector<std::shared_ptr<Dict>> namespaces;  // emptied after the render: breaks reference cycles
  int64_t steps = 0;
  int call_depth = 0;
  int line = 0;  // of what runs now, for error messages

  ~Renderer() {
    for (auto& ns : namespaces) ns->items.clear();
  }

  void step() {
    if (++steps > kMaxSteps) fail("the template runs too long (over " + std::to_string(kMaxSteps) + " loop steps and calls)");
  }

  static void emit(std::string& out, std::string_view s) {
    check_size(out.size() + s.size());
    out.append(s);
  }

  Value lookup(const std::string& name, const Scope& scope) const;

  Flow exec(const std::vector<Node>& body, const ScopePtr& scope, std::string& out) {
    for (const Node& n : body) {
      const Flow f = exec_node(n, scope, out);
      if (f != Flow::kNormal) return f;
    }
    return Flow::kNormal;
  }

  Flow exec_node(const Node& n, const ScopePtr& scope, std::string& out) {
    try {
      line = n.line;
      return run_node(n, scope, out);
    } catch (Fail& f) {
      if (f.raised) throw Error(ErrorKind::kInvalidArgument, "chat template: " + f.message);
      throw Error(ErrorKind::kInvalidArgument, "chat template line " + std::to_string(line) + ": " + f.message);
    }
  }

  void assign(Scope& scope, const Node& n, const Value& v) {
    if (!n.tuple_target) {
      scope.set(n.targets[0], v);
      return;
    }
    auto items = iterate(v);
    if (items->size() != n.targets.size()) {
      fail(items->size() < n.targets.size()
               ? "not enough values to unpack (expected " + std::to_string(n.targets.size()) + ", got " +
                     std::to_string(items->size()) + ")"
               : "too many values to unpack (expected " + std::to_string(n.targets.size()) + ")");
    }
    for (size_t k = 0; k < n.targets.size(); ++k) scope.set(n.targets[k], (*items)[k]);
  }

  Value apply_chain(const std::vector<ExprPtr>& filters, Value v, const ScopePtr& scope) {
    for (const ExprPtr& f : filters) v = apply_filter(*f, v, scope);
    return v;
  }

  Flow run_node(const Node& n, const ScopePtr& scope, std::string& out) {
    switch (n.kind) {
      case NK::kText: emit(out, n.text); return Flow::kNormal;
      case NK::kOutput: {
        const Value v = eval(*n.expr, scope);
        if (v.type == Type::kString) {
          emit(out, v.s);
        } else {
          std::string s;
          to_str(v, s);
          emit(out, s);
        }
        return Flow::kNormal;
      }
      case NK::kIf: return exec(truthy(eval(*n.expr, scope)) ? n.body : n.else_body, scope, out);
      case NK::kFor: return run_for(n, scope, out);
      case NK::kSet: assign(*scope, n, eval(*n.expr, scope)); return Flow::kNormal;
      case NK::kSetNs: {
        const Value* ns = scope->find(n.targets[0]);
        if (ns == nullptr) ns = context->find(n.targets[0]);
        if (ns == nullptr || ns->type != Type::kNamespace) fail("cannot assign attribute on non-namespace object");
        std::shared_ptr<Dict> d = ns->dict;
        d->set(n.text, eval(*n.expr, scope));
        return Flow::kNormal;
      }
      case NK::kSetBlock: {
        std::string buf;
        const Flow f = exec(n.body, child(scope), buf);
        if (f != Flow::kNormal) return f;
        line = n.line;
        assign(*scope, n, apply_chain(n.filters, Value::str(std::move(buf)), scope));
        return Flow::kNormal;
      }
      case NK::kFilterBlock: {
        std::string buf;
        const Flow f = exec(n.body, child(scope), buf);
        if (f != Flow::kNormal) return f;
        line = n.line;
        emit(out, to_str(apply_chain(n.filters, Value::str(std::move(buf)), scope)));
        return Flow::kNormal;
      }
      case NK::kMacro: scope->set(n.text, define_macro(n, scope)); return Flow::kNormal;
      case NK::kGeneration: {
        // transformers' AssistantTracker: the block's text, placed at the length of what the
        // template has output so far (its exact offset unless the block is inside a macro or a
        // filter block, where transformers' offset is what this reproduces).
        std::string buf;
        exec(n.body, child(scope), buf);
        const size_t start = top->size();
        generation.emplace_back(start, start + buf.size());
        emit(out, buf);
        return Flow::kNormal;
      }
      case NK::kBreak: return Flow::kBreak;
      case NK::kContinue: return Flow::kContinue;
    }
    return Flow::kNormal;
  }

  Flow run_for(const Node& n, const ScopePtr& scope, std::string& out) {
    std::shared_ptr<const List> items = iterate(eval(*n.expr, scope));
    if (n.cond) {
      List kept;
      for (const Value& item : *items) {
        step();
        auto s = child(scope);
        assign(*s, n, item);
        if (truthy(eval(*n.cond, s))) kept.push_back(item);
      }
      items = std::make_shared<const List>(std::move(kept));
    }
    if (items->empty()) return exec(n.else_body, child(scope), out);
    auto state = std::make_shared<LoopState>();
    state->items = items;
    Value loop;
    loop.type = Type::kLoop;
    loop.loop = state;
    for (size_t k = 0; k < items->size(); ++k) {
      step();
      line = n.line;
      state->index = k;
      auto s = child(scope);  // each iteration is a scope of its own, as in Jinja2
      assign(*s, n, (*items)[k]);
      s->set("loop", loop);
      if (exec(n.body, s, out) == Flow::kBreak) break;
    }
    return Flow::kNormal;
  }

  Value define_macro(const Node& n, const ScopePtr& scope) {
    std::weak_ptr<Scope> defined_in = scope;  // weak: the scope holds the macro
    Renderer* self = this;
    const Node* node = &n;
    auto c = std::make_shared<Callable>();
    c->name = n.text;
    c->macro = true;
    c->call = [self, node, defined_in](Args& a) { return self->call_macro(*node, defined_in, a); };
    Value v;
    v.type = Type::kCallable;
    v.fn = std::move(c);
    return v;
  }

  Value call_macro(const Node& n, const std::weak_ptr<Scope>& defined_in, Args& a) {
    ScopePtr parent = defined_in.lock();
    if (!parent) fail("macro '" + n.text + "' is called after the scope that defined it ended");
    if (a.pos.size() > n.targets.size())
      fail("macro '" + n.text + "' takes not more than " + std::to_string(n.targets.size()) + " argument(s)");
    for (const auto& [k, v] : a.kw)
      if (std::find(n.targets.begin(), n.targets.end(), k) == n.targets.end())
        fail("macro '" + n.text + "' takes no keyword argument '" + k + "'");
    if (call_depth >= kMaxCallDepth) fail("macro calls nest deeper than " + std::to_string(kMaxCallDepth));
    struct DepthGuard {
      int& d;
      explicit DepthGuard(int& x) : d(x) { ++d; }
      ~DepthGuard() { --d; }
    } guard(call_depth);
    auto s = child(parent);
    for (size_t k = 0; k < n.targets.size(); ++k) {
      if (const Value* v = param(a, k, n.targets[k].c_str())) {
        s->set(n.targets[k], *v);
      } else if (n.defaults[k]) {
        s->set(n.targets[k], eval(*n.defaults[k], s));
      } else {
        s->set(n.targets[k], Value::undefined("parameter '" + n.targets[k] + "' was not provided"));
      }
    }
    std::string out;
    const int saved_line = line;
    exec(n.body, s, out);
    line = saved_line;
    return Value::str(std::move(out));
  }

  Value call(const Value& callee, Args& a) {
    if (callee.is_undefined()) {
      if (callee.unsafe) fail(callee.s);
      undefined_error(callee);
    }
    if (callee.type != Type::kCallable) fail("'" + type_name(callee) + "' object is not callable");
    step();
    return callee.fn->call(a);
  }

  Args eval_args(const Expr& e, size_t first, const ScopePtr& scope) {
    Args a;
    for (size_t k = first; k < e.args.size(); ++k) a.pos.push_back(eval(*e.args[k], scope));
    for (const auto& [name, x] : e.kwargs) a.kw.emplace_back(name, eval(*x, scope));
    return a;
  }

  Value apply_filter(const Expr& f, const Value& subject, const ScopePtr& scope) {
    Args a = eval_args(f, 1, scope);
    return f.filter(*this, subject, a);
  }

  Value eval(const Expr& e, const ScopePtr& scope) {
    line = e.line;
    switch (e.kind) {
      case EK::kConst: return e.value;
      case EK::kName: return lookup(e.name, *scope);
      case EK::kList:
      case EK::kTuple: {
        List items;
        items.reserve(e.args.size());
        for (const ExprPtr& x : e.args) items.push_back(eval(*x, scope));
        return Value::make_list(std::move(items), e.kind == EK::kTuple ? Seq::kTuple : Seq::kList);
      }
      case EK::kDict: {
        auto d = std::make_shared<Dict>();
        for (size_t k = 0; k + 1 < e.args.size(); k += 2) {
          const Value key = eval(*e.args[k], scope);
          if (key.type != Type::kString)
            throw Error(ErrorKind::kNotSupported, "chat template line " + std::to_string(e.line) +
                                                      ": dict keys other than strings are not supported");
          d->set(key.s, eval(*e.args[k + 1], scope));
        }
        return Value::make_dict(std::move(d));
      }
      case EK::kGetattr: return get_attribute(eval(*e.args[0], scope), e.name);
      case EK::kGetitem: {
        const Value obj = eval(*e.args[0], scope);
        return get_item(obj, eval(*e.args[1], scope));
      }
      case EK::kSlice: {
        const Value obj = eval(*e.args[0], scope);
        const Value none = Value::none();
        const Value a = e.args[1] ? eval(*e.args[1], scope) : none;
        const Value b = e.args[2] ? eval(*e.args[2], scope) : none;
        const Value c = e.args[3] ? eval(*e.args[3], scope) : none;
        return get_slice(obj, a, b, c);
      }
      case EK::kCall: {
        const Value callee = eval(*e.args[0], scope);
        Args a = eval_args(e, 1, scope);
        line = e.line;
        return call(callee, a);
      }
      case EK::kFilter: return apply_filter(e, eval(*e.args[0], scope), scope);
      case EK::kTest: {
        const Value v = eval(*e.args[0], scope);
        Args a = eval_args(e, 1, scope);
        return Value::boolean(e.test(*this, v, a) != e.negated);
      }
      case EK::kNeg:
      case EK::kPos: {
        const Value v = eval(*e.args[0], scope);
        if (v.is_undefined()) undefined_error(v);
        if (v.is_int()) {
          if (e.kind == EK::kPos) return Value::integer(v.as_int());
          return Value::integer(checked(v.as_int() == INT64_MIN, -v.as_int()));
        }
        if (v.type == Type::kFloat) return Value::number(e.kind == EK::kNeg ? -v.f : v.f);
        fail(std::string("bad operand type for unary ") + (e.kind == EK::kNeg ? "-" : "+") + ": '" + type_name(v) + "'");
      }
      case EK::kNot: return Value::boolean(!truthy(eval(*e.args[0], scope)));
      case EK::kBinary: {
        const Value a = eval(*e.args[0], scope);
        const Value b = eval(*e.args[1], scope);
        line = e.line;
        return binary(e.name, a, b);
      }
      case EK::kAnd: {
        Value a = eval(*e.args[0], scope);
        return truthy(a) ? eval(*e.args[1], scope) : a;
      }
      case EK::kOr: {
        Value a = eval(*e.args[0], scope);
        return truthy(a) ? a : eval(*e.args[1], scope);
      }
      case EK::kCompare: {
        Value left = eval(*e.args[0], scope);
        for (size_t k = 0; k < e.ops.size(); ++k) {
          Value right = eval(*e.args[k + 1], scope);
          const std::string& op = e.ops[k];
          bool r;
          if (op == "==") r = py_eq(left, right);
          else if (op == "!=") r = !py_eq(left, right);
          else if (op == "in") r = py_in(left, right);
          else if (op == "not in") r = !py_in(left, right);
          else {
            const int c = py_cmp(left, right, op.c_str());
            r = op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0;
          }
          if (!r) return Value::boolean(false);
          left = std::move(right);
        }
        return Value::boolean(true);
      }
      case EK::kCond:
        if (truthy(eval(*e.args[0], scope))) return eval(*e.args[1], scope);
        if (e.args[2]) return eval(*e.args[2], scope);
        return Value::undefined("the inline if-expression on line " + std::to_string(e.line) +
                                " evaluated to false and no else section was defined.");
      case EK::kConcat: {
        std::string s;
        for (const ExprPtr& x : e.args) {
          to_str(eval(*x, scope), s);
          check_size(s.size());
        }
        return Value::str(std::move(s));
      }
    }
    fail("unknown expression");
  }
};

// ---- globals ------------------------------------------------------------------------------

Value make_namespace(Renderer& r, Args& a, const char* fn) {
  auto d = std::make_shared<Dict>();
  if (a.pos.size() > 1) fail(std::string(fn) + " expected at most 1 positional argument");
  if (!a.pos.empty()) {
    const Value& init = a.pos[0];
    if (init.type == Type::kDict || init.type == Type::kNamespace) {
      d->items = init.dict->items;
    } else {
      const auto held_pair = iterate(init);  // holds the items while the loop runs
      for (const Value& pair : *held_pair) {
        auto kv = iterate(pair);
        if (kv->size() != 2) fail(std::string(fn) + ": a sequence element does not have length 2");
        if ((*kv)[0].type != Type::kString)
          throw Error(ErrorKind::kNotSupported, "chat template: dict keys other than strings are not supported");
        d->set((*kv)[0].s, (*kv)[1]);
      }
    }
  }
  for (auto& [k, v] : a.kw) d->set(k, v);
  Value v;
  v.dict = d;
  if (std::strcmp(fn, "namespace") == 0) {
    v.type = Type::kNamespace;
    r.namespaces.push_back(d);
  } else {
    v.type = Type::kDict;
  }
  return v;
}

Value global_range(Args& a) {
  if (!a.kw.empty()) fail("range() takes no keyword arguments");
  if (a.pos.empty() || a.pos.size() > 3) fail("range expected 1 to 3 arguments, got " + std::to_string(a.pos.size()));
  for (const Value& v : a.pos)
    if (!v.is_int()) fail("'" + type_name(v) + "' object cannot be interpreted as an integer");
  int64_t start = 0, stop = 0, step = 1;
  if (a.pos.size() == 1) {
    stop = a.pos[0].as_int();
  } else {
    start = a.pos[0].as_int();
    stop = a.pos[1].as_int();
    if (a.pos.size() == 3) step = a.pos[2].as_int();
  }
  if (step == 0) fail("range() arg 3 must not be zero");
  List items;
  for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) {
    if (static_cast<int64_t>(items.size()) >= kMaxRange)
      fail("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
    items.push_back(Value::integer(k));
  }
  Value v = Value::make_list(std::move(items), Seq::kRange);
  v.s = "range(" + std::to_string(start) + ", " + std::to_string(stop);
  if (step != 1) v.s.append(", " + std::to_string(step));
  v.s.push_back(')');
  return v;
}

Value strftime_now(Args& a) {
  signature(a, "strftime_now", {"format"});
  const Value* f = param(a, 0, "format");
  if (f == nullptr || f->type != Type::kString) fail("strftime_now() needs a format string");
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  // A trailing space tells an empty result from a buffer too small (strftime returns 0 for both).
  const std::string fmt = f->s + " ";
  for (size_t cap = 64; cap <= (size_t{1} << 20); cap *= 4) {
    std::string buf(cap, '\0');
    const size_t n = std::strftime(buf.data(), cap, fmt.c_str(), &tm);
    if (n > 0) {
      buf.resize(n - 1);
      return Value::str(std::move(buf));
    }
  }
  fail("strftime_now(): the formatted date is too long");
}

Value Renderer::lookup(const std::string& name, const Scope& scope) const {
  if (const Value* v = scope.find(name)) return *v;
  if (const Value* v = context->find(name)) return *v;
  Renderer* self = const_cast<Renderer*>(this);
  if (name == "range") return make_callable("range", global_range);
  if (name == "namespace") return make_callable("namespace", [self](Args& a) { return make_namespace(*self, a, "namespace"); });
  if (name == "dict") return make_callable("dict", [self](Args& a) { return make_namespace(*self, a, "dict"); });
  if (name == "raise_exception") {
    return make_callable("raise_exception", [](Args& a) -> Value {
      const Value* m = param(a, 0, "message");
      throw Fail{m == nullptr ? std::string() : to_str(*m), true};
    });
  }
  if (name == "strftime_now") return make_callable("strftime_now", strftime_now);
  return Value::undefined("'" + name + "' is undefined");
}

}  // namespace

// ---- filters and tests ----------------------------------------------------------------------

namespace {

// Jinja2's make_attrgetter: "a.b.0" looks up a, then b, then item 0, each with getitem.
Value attr_path(const Value& item, const std::string& path) {
  Value v = item;
  size_t pos = 0;
  while (true) {
    const size_t dot = path.find('.', pos);
    const std::string part = path.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
    const bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    v = get_item(v, digits ? Value::integer(std::stoll(part)) : Value::str(part));
    if (dot == std::string::npos) return v;
    pos = dot + 1;
  }
}

Value attribute_of(const Value& item, const Value* attribute) {
  if (attribute == nullptr || attribute->type == Type::kNone) return item;
  if (attribute->is_int()) return get_item(item, *attribute);
  return attr_path(item, to_str(*attribute));
}

Value ignore_case(const Value& v) { return v.type == Type::kString ? Value::str(lower_str(v.s)) : v; }

Value iterator_of(List items) { return Value::make_list(std::move(items), Seq::kIterator); }

std::string soft_str(const Value& v) { return to_str(v); }

Value f_trim(Renderer&, const Value& v, Args& a) {
  signature(a, "trim", {"chars"});
  return Value::str(py_strip(soft_str(v), param(a, 0, "chars"), true, true));
}

Value f_tojson(Renderer&, const Value& v, Args& a) {
  signature(a, "tojson", {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonStyle st;
  st.ensure_ascii = bool_param(a, 0, "ensure_ascii", false);
  const Value* indent = param(a, 1, "indent");
  if (indent != nullptr && indent->type != Type::kNone) {
    if (indent->is_int()) {
      st.indent = std::string(static_cast<size_t>(std::max<int64_t>(0, std::min<int64_t>(indent->as_int(), 1024))), ' ');
    } else if (indent->type == Type::kString) {
      st.indent = indent->s;
    } else {
      fail("tojson: indent must be an int or a str");
    }
    st.item_sep = ",";
  }
  const Value* seps = param(a, 2, "separators");
  if (seps != nullptr && seps->type != Type::kNone) {
    auto items = iterate(*seps);
    if (items->size() != 2 || (*items)[0].type != Type::kString || (*items)[1].type != Type::kString)
      fail("tojson: separators must be two strings");
    st.item_sep = (*items)[0].s;
    st.key_sep = (*items)[1].s;
  }
  st.sort_keys = bool_param(a, 3, "sort_keys", false);
  std::string out;
  to_json(v, out, st, 0);
  return Value::str(std::move(out));
}

Value f_length(Renderer&, const Value& v, Args& a) {
  signature(a, "length", {});
  return Value::integer(py_len(v));
}

Value f_first(Renderer&, const Value& v, Args& a) {
  signature(a, "first", {});
  auto items = iterate(v);
  if (items->empty()) return Value::undefined("No first item, sequence was empty.");
  return items->front();
}

Value f_last(Renderer&, const Value& v, Args& a) {
  signature(a, "last", {});
  if (v.type == Type::kList && v.seq == Seq::kIterator) fail("'generator' object is not reversible");
  if (v.type != Type::kString && v.type != Type::kList && v.type != Type::kDict && !v.is_undefined())
    fail("'" + type_name(v) + "' object is not reversible");
  auto items = iterate(v);
  if (items->empty()) return Value::undefined("No last item, sequence was empty.");
  return items->back();
}

Value f_join(Renderer&, const Value& v, Args& a) {
  signature(a, "join", {"d", "attribute"});
  const Value* d = param(a, 0, "d");
  const std::string sep = d == nullptr ? std::string() : soft_str(*d);
  const Value* attribute = param(a, 1, "attribute");
  std::string out;
  bool first = true;
  const auto held_item = iterate(v);  // holds the items while the loop runs
  for (const Value& item : *held_item) {
    if (!first) out.append(sep);
    first = false;
    to_str(attribute_of(item, attribute), out);
    check_size(out.size());
  }
  return Value::str(std::move(out));
}

Value f_upper(Renderer&, const Value& v, Args& a) {
  signature(a, "upper", {});
  return Value::str(upper_str(soft_str(v)));
}
Value f_lower(Renderer&, const Value& v, Args& a) {
  signature(a, "lower", {});
  return Value::str(lower_str(soft_str(v)));
}
Value f_capitalize(Renderer&, const Value& v, Args& a) {
  signature(a, "capitalize", {});
  return Value::str(py_capitalize(soft_str(v)));
}

// Jinja2's title filter: the first character of the text and each one after -, whitespace or an
// opening bracket upper-cased, the rest lower-cased.
Value f_title(Renderer&, const Value& v, Args& a) {
  signature(a, "title", {});
  const std::u32string u = to_u32(soft_str(v));
  std::string r;
  bool start = true;
  for (size_t k = 0; k < u.size(); ++k) {
    const char32_t c = u[k];
    if (start) append_upper(r, c);
    else append_lower(r, u, k);
    start = c == '-' || is_space(c) || c == '(' || c == '{' || c == '[' || c == '<';
  }
  return Value::str(std::move(r));
}

Value f_default(Renderer&, const Value& v, Args& a) {
  signature(a, "default", {"default_value", "boolean"});
  const Value* d = param(a, 0, "default_value");
  if (v.is_undefined() || (bool_param(a, 1, "boolean", false) && !truthy(v))) return d ? *d : Value::str("");
  return v;
}

Value f_list(Renderer&, const Value& v, Args& a) {
  signature(a, "list", {});
  return Value::make_list(*iterate(v));
}

Value f_string(Renderer&, const Value& v, Args& a) {
  signature(a, "string", {});
  return Value::str(soft_str(v));
}

Value f_int(Renderer&, const Value& v, Args& a) {
  signature(a, "int", {"default", "base"});
  const Value* d = param(a, 0, "default");
  const Value dflt = d ? *d : Value::integer(0);
  const int64_t base = int_param(a, 1, "base", 10, "int");
  if (v.is_int()) return Value::integer(v.as_int());
  if (v.type == Type::kFloat) {
    if (std::isnan(v.f)) return dflt;
    if (std::isinf(v.f)) fail("cannot convert float infinity to integer");
    if (std::fabs(v.f) >= 9.2e18) throw Error(ErrorKind::kNotSupported, "chat template: an integer exceeds 64 bits");
    return Value::integer(static_cast<int64_t>(v.f));
  }
  if (v.type == Type::kString) {
    if (auto x = parse_int(v.s, base)) return Value::integer(*x);
    if (auto x = parse_float(v.s)) {
      if (std::isfinite(*x) && std::fabs(*x) < 9.2e18) return Value::integer(static_cast<int64_t>(*x));
      if (std::isinf(*x)) fail("cannot convert float infinity to integer");
    }
  }
  return dflt;
}

Value f_float(Renderer&, const Value& v, Args& a) {
  signature(a, "float", {"default"});
  const Value* d = param(a, 0, "default");
  if (v.is_number()) return Value::number(v.as_float());
  if (v.type == Type::kString)
    if (auto x = parse_float(v.s)) return Value::number(*x);
  return d ? *d : Value::number(0.0);
}

Value f_abs(Renderer&, const Value& v, Args& a) {
  signature(a, "abs", {});
  if (v.is_int()) return Value::integer(checked(v.as_int() == INT64_MIN, std::abs(v.as_int())));
  if (v.type == Type::kFloat) return Value::number(std::fabs(v.f));
  if (v.is_undefined()) undefined_error(v);
  fail("bad operand type for abs(): '" + type_name(v) + "'");
}

Value f_round(Renderer&, const Value& v, Args& a) {
  signature(a, "round", {"precision", "method"});
  const int64_t precision = int_param(a, 0, "precision", 0, "round");
  const Value* m = param(a, 1, "method");
  const std::string method = m == nullptr ? "common" : soft_str(*m);
  if (method != "common" && method != "ceil" && method != "floor")
    fail("method must be common, ceil or floor");
  if (v.is_undefined()) undefined_error(v);
  if (!v.is_number()) fail("type " + type_name(v) + " doesn't define __round__ method");
  if (method == "common") {
    if (v.is_int()) {
      if (precision >= 0) return Value::integer(v.as_int());
      if (precision < -18) return Value::integer(0);
      int64_t p = 1;
      for (int64_t k = 0; k < -precision; ++k) p *= 10;
      const int64_t x = v.as_int();
      int64_t q = floor_div(x, p), r = x - q * p;
      if (2 * r > p || (2 * r == p && (q & 1))) ++q;  // ties to even
      return Value::integer(mul_int(q, p));
    }
    return Value::number(py_round(v.f, precision));
  }
  const double p = std::pow(10.0, static_cast<double>(precision));
  const double x = v.as_float() * p;
  return Value::number((method == "ceil" ? std::ceil(x) : std::floor(x)) / p);
}

Value f_replace(Renderer&, const Value& v, Args& a) {
  signature(a, "replace", {"old", "new", "count"});
  const Value* old = param(a, 0, "old");
  const Value* rep = param(a, 1, "new");
  if (old == nullptr || rep == nullptr) fail("replace() needs old and new");
  return Value::str(py_replace(soft_str(v), soft_str(*old), soft_str(*rep), int_param(a, 2, "count", -1, "replace")));
}

Value f_reverse(Renderer&, const Value& v, Args& a) {
  signature(a, "reverse", {});
  if (v.type == Type::kString) {
    std::u32string u = to_u32(v.s);
    std::reverse(u.begin(), u.end());
    return Value::str(to_utf8(u));
  }
  List items = *iterate(v);
  std::reverse(items.begin(), items.end());
  // Python's reversed() gives an iterator (Undefined too: it has a len and items); a generator is
  // made a reversed list.
  const bool reversible = (v.type == Type::kList && v.seq != Seq::kIterator) || v.type == Type::kDict || v.is_undefined();
  return Value::make_list(std::move(items), reversible ? Seq::kIterator : Seq::kList);
}

// Sort keys: the attribute(s) (comma-separated) of each item, lower-cased unless case_sensitive.
std::vector<List> sort_keys(const List& items, const Value* attribute, bool case_sensitive) {
  std::vector<std::string> paths;
  if (attribute != nullptr && attribute->type == Type::kString) {
    size_t pos = 0;
    while (true) {
      const size_t c = attribute->s.find(',', pos);
      paths.push_back(attribute->s.substr(pos, c == std::string::npos ? std::string::npos : c - pos));
      if (c == std::string::npos) break;
      pos = c + 1;
    }
  }
  std::vector<List> keys;
  keys.reserve(items.size());
  for (const Value& item : items) {
    List k;
    if (paths.empty()) {
      k.push_back(attribute_of(item, attribute));
    } else {
      for (const auto& p : paths) k.push_back(attr_path(item, p));
    }
    if (!case_sensitive)
      for (Value& x : k) x = ignore_case(x);
    keys.push_back(std::move(k));
  }
  return keys;
}

int compare_keys(const List& a, const List& b) {
  for (size_t k = 0; k < a.size(); ++k) {
    if (py_eq(a[k], b[k])) continue;
    return py_cmp(a[k], b[k], "<");
  }
  return 0;
}

List sorted(const List& items, const std::vector<List>& keys, bool reverse) {
  std::vector<size_t> order(items.size());
  for (size_t k = 0; k < order.size(); ++k) order[k] = k;
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) {
    return reverse ? compare_keys(keys[y], keys[x]) < 0 : compare_keys(keys[x], keys[y]) < 0;
  });
  List out;
  out.reserve(items.size());
  for (size_t k : order) out.push_back(items[k]);
  return out;
}

Value f_sort(Renderer&, const Value& v, Args& a) {
  signature(a, "sort", {"reverse", "case_sensitive", "attribute"});
  const auto held = iterate(v);
  const List& items = *held;
  const auto keys = sort_keys(items, param(a, 2, "attribute"), bool_param(a, 1, "case_sensitive", false));
  return Value::make_list(sorted(items, keys, bool_param(a, 0, "reverse", false)));
}

Value f_dictsort(Renderer&, const Value& v, Args& a) {
  signature(a, "dictsort", {"case_sensitive", "by", "reverse"});
  if (v.type != Type::kDict) fail("'" + type_name(v) + "' object has no attribute 'items'");
  const Value* by = param(a, 1, "by");
  const std::string b = by == nullptr ? "key" : soft_str(*by);
  if (b != "key" && b != "value") fail("You can only sort by either \"key\" or \"value\"");
  const bool cs = bool_param(a, 0, "case_sensitive", false);
  List items;
  std::vector<List> keys;
  for (const auto& [k, x] : v.dict->items) {
    items.push_back(tuple_of({Value::str(k), x}));
    Value key = b == "key" ? Value::str(k) : x;
    keys.push_back({cs ? key : ignore_case(key)});
  }
  return Value::make_list(sorted(items, keys, bool_param(a, 2, "reverse", false)));
}

Value f_items(Renderer&, const Value& v, Args& a) {
  signature(a, "items", {});
  if (v.is_undefined()) return iterator_of({});
  if (v.type != Type::kDict) fail("Can only get item pairs from a mapping.");
  List out;
  for (const auto& [k, x] : v.dict->items) out.push_back(tuple_of({Value::str(k), x}));
  return iterator_of(std::move(out));
}

Value f_unique(Renderer&, const Value& v, Args& a) {
  signature(a, "unique", {"case_sensitive", "attribute"});
  const auto held = iterate(v);
  const List& items = *held;
  const auto keys = sort_keys(items, param(a, 1, "attribute"), bool_param(a, 0, "case_sensitive", false));
  List out;
  std::vector<const Value*> seen;
  for (size_t k = 0; k < items.size(); ++k) {
    const Value& key = keys[k][0];
    if (key.type == Type::kList || key.type == Type::kDict) fail("unhashable type: '" + type_name(key) + "'");
    bool dup = false;
    for (const Value* s : seen) dup = dup || py_eq(*s, key);
    if (!dup) {
      seen.push_back(&key);
      out.push_back(items[k]);
    }
  }
  return iterator_of(std::move(out));
}

Value min_max(const Value& v, Args& a, bool want_max, const char* fn) {
  signature(a, fn, {"case_sensitive", "attribute"});
  const auto held = iterate(v);
  const List& items = *held;
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  const auto keys = sort_keys(items, param(a, 1, "attribute"), bool_param(a, 0, "case_sensitive", false));
  size_t best = 0;
  for (size_t k = 1; k < items.size(); ++k) {
    const int c = compare_keys(keys[k], keys[best]);
    if (want_max ? c > 0 : c < 0) best = k;
  }
  return items[best];
}
Value f_max(Renderer&, const Value& v, Args& a) { return min_max(v, a, true, "max"); }
Value f_min(Renderer&, const Value& v, Args& a) { return min_max(v, a, false, "min"); }

Value f_sum(Renderer&, const Value& v, Args& a) {
  signature(a, "sum", {"attribute", "start"});
  const Value* start = param(a, 1, "start");
  Value total = start ? *start : Value::integer(0);
  const Value* attribute = param(a, 0, "attribute");
  const auto held_item = iterate(v);  // holds the items while the loop runs
  for (const Value& item : *held_item) total = binary("+", total, attribute_of(item, attribute));
  return total;
}

Value f_map(Renderer& r, const Value& v, Args& a) {
  List out;
  const Value* attribute = nullptr;
  for (const auto& [k, x] : a.kw)
    if (k == "attribute") attribute = &x;
  if (a.pos.empty() && attribute != nullptr) {
    Value dflt;
    for (const auto& [k, x] : a.kw) {
      if (k == "default") dflt = x;
      else if (k != "attribute") fail("Unexpected keyword argument '" + k + "'");
    }
    if (truthy(v)) {
      const auto held_item = iterate(v);  // holds the items while the loop runs
      for (const Value& item : *held_item) {
        Value x = attribute_of(item, attribute);
        out.push_back(x.is_undefined() && !dflt.is_undefined() ? dflt : x);
      }
    }
    return iterator_of(std::move(out));
  }
  if (a.pos.empty()) fail("map requires a filter argument");
  const std::string name = soft_str(a.pos[0]);
  auto it = filter_table().find(name);
  if (it == filter_table().end()) fail("No filter named '" + name + "'.");
  Args rest;
  rest.pos.assign(a.pos.begin() + 1, a.pos.end());
  rest.kw = a.kw;
  if (truthy(v)) {
    const auto held_item = iterate(v);  // holds the items while the loop runs
    for (const Value& item : *held_item) {
      Args copy = rest;
      out.push_back(it->second(r, item, copy));
    }
  }
  return iterator_of(std::move(out));
}

Value select_reject(Renderer& r, const Value& v, Args& a, bool select, bool by_attr) {
  size_t off = 0;
  const Value* attribute = nullptr;
  if (by_attr) {
    if (a.pos.empty()) fail("Missing parameter for attribute name");
    attribute = &a.pos[0];
    off = 1;
  }
  TestFn test = nullptr;
  Args targs;
  if (a.pos.size() > off) {
    const std::string name = soft_str(a.pos[off]);
    auto it = test_table().find(name);
    if (it == test_table().end()) fail("No test named '" + name + "'.");
    test = it->second;
    targs.pos.assign(a.pos.begin() + static_cast<std::ptrdiff_t>(off) + 1, a.pos.end());
    targs.kw = a.kw;
  }
  List out;
  if (truthy(v)) {
    const auto held_item = iterate(v);  // holds the items while the loop runs
    for (const Value& item : *held_item) {
      const Value x = by_attr ? attr_path(item, soft_str(*attribute)) : item;
      bool ok;
      if (test != nullptr) {
        Args copy = targs;
        ok = test(r, x, copy);
      } else {
        ok = truthy(x);
      }
      if (ok == select) out.push_back(item);
    }
  }
  return iterator_of(std::move(out));
}
Value f_select(Renderer& r, const Value& v, Args& a) { return select_reject(r, v, a, true, false); }
Value f_reject(Renderer& r, const Value& v, Args& a) { return select_reject(r, v, a, false, false); }
Value f_selectattr(Renderer& r, const Value& v, Args& a) { return select_reject(r, v, a, true, true); }
Value f_rejectattr(Renderer& r, const Value& v, Args& a) { return select_reject(r, v, a, false, true); }

// Jinja2's indent: lines after the first (and the first with first=True) prefixed; blank lines
// only with blank=True.
Value f_indent(Renderer&, const Value& v, Args& a) {
  signature(a, "indent", {"width", "first", "blank"});
  const Value* w = param(a, 0, "width");
  std::string ind;
  if (w != nullptr && w->type == Type::kString) {
    ind = w->s;
  } else {
    const int64_t n = int_param(a, 0, "width", 4, "indent");
    ind.assign(static_cast<size_t>(std::max<int64_t>(0, std::min<int64_t>(n, 1 << 20))), ' ');
  }
  const bool first = bool_param(a, 1, "first", false), blank = bool_param(a, 2, "blank", false);
  std::string s = soft_str(v);
  s.push_back('\n');
  const auto lines = py_splitlines(s, false);
  std::string out;
  for (size_t k = 0; k < lines.size(); ++k) {
    if (k > 0) {
      out.push_back('\n');
      if (blank || !lines[k].empty()) out.append(ind);
    }
    out.append(lines[k]);
    check_size(out.size());
  }
  if (first) out.insert(0, ind);
  return Value::str(std::move(out));
}

Value f_safe(Renderer&, const Value& v, Args& a) {
  signature(a, "safe", {});
  return Value::str(soft_str(v));
}

Value f_escape(Renderer&, const Value& v, Args& a) {
  signature(a, "escape", {});
  std::string out;
  for (char c : soft_str(v)) {
    switch (c) {
      case '&': out.append("&amp;"); break;
      case '<': out.append("&lt;"); break;
      case '>': out.append("&gt;"); break;
      case '"': out.append("&#34;"); break;
      case '\'': out.append("&#39;"); break;
      default: out.push_back(c);
    }
  }
  return Value::str(std::move(out));
}

Value f_wordcount(Renderer&, const Value& v, Args& a) {
  signature(a, "wordcount", {});
  int64_t n = 0;
  bool in_word = false;
  for (char32_t c : to_u32(soft_str(v))) {
    const bool w = is_word(c);
    if (w && !in_word) ++n;
    in_word = w;
  }
  return Value::integer(n);
}

Value f_center(Renderer&, const Value& v, Args& a) {
  signature(a, "center", {"width"});
  return Value::str(pad(soft_str(v), int_param(a, 0, "width", 80, "center"), " ", 0));
}

Value f_attr(Renderer&, const Value& v, Args& a) {
  signature(a, "attr", {"name"});
  const Value* name = param(a, 0, "name");
  if (name == nullptr) fail("attr() missing required argument 'name'");
  if (v.is_undefined()) undefined_error(v);
  const std::string n = soft_str(*name);
  if (auto x = py_getattr(v, n)) return *x;
  return Value::undefined(no_attribute(v, n));
}

Value f_batch(Renderer&, const Value& v, Args& a) {
  signature(a, "batch", {"linecount", "fill_with"});
  const int64_t n = int_param(a, 0, "linecount", 0, "batch");
  if (n <= 0) fail("batch: linecount must be positive");
  const Value* fill = param(a, 1, "fill_with");
  List out, cur;
  const auto held_item = iterate(v);  // holds the items while the loop runs
  for (const Value& item : *held_item) {
    if (static_cast<int64_t>(cur.size()) == n) {
      out.push_back(Value::make_list(std::move(cur)));
      cur.clear();
    }
    cur.push_back(item);
  }
  if (!cur.empty()) {
    if (fill != nullptr && fill->type != Type::kNone)
      while (static_cast<int64_t>(cur.size()) < n) cur.push_back(*fill);
    out.push_back(Value::make_list(std::move(cur)));
  }
  return iterator_of(std::move(out));
}

const std::unordered_map<std::string, FilterFn>& filter_table() {
  static const std::unordered_map<std::string, FilterFn> t = {
      {"abs", f_abs},           {"attr", f_attr},         {"batch", f_batch},       {"capitalize", f_capitalize},
      {"center", f_center},     {"count", f_length},      {"d", f_default},         {"default", f_default},
      {"dictsort", f_dictsort}, {"e", f_escape},          {"escape", f_escape},     {"first", f_first},
      {"float", f_float},       {"forceescape", f_escape}, {"indent", f_indent},    {"int", f_int},
      {"items", f_items},       {"join", f_join},         {"last", f_last},         {"length", f_length},
      {"list", f_list},         {"lower", f_lower},       {"map", f_map},           {"max", f_max},
      {"min", f_min},           {"reject", f_reject},     {"rejectattr", f_rejectattr}, {"replace", f_replace},
      {"reverse", f_reverse},   {"round", f_round},       {"safe", f_safe},         {"select", f_select},
      {"selectattr", f_selectattr}, {"sort", f_sort},     {"string", f_string},     {"sum", f_sum},
      {"title", f_title},       {"tojson", f_tojson},     {"trim", f_trim},         {"unique", f_unique},
      {"upper", f_upper},       {"wordcount", f_wordcount},
  };
  return t;
}

const Value& test_arg(const Args& a, const char* test) {
  if (a.pos.size() != 1 || !a.kw.empty()) fail(std::string("the test '") + test + "' takes one argument");
  return a.pos[0];
}

bool t_defined(Renderer&, const Value& v, Args&) { return !v.is_undefined(); }
bool t_undefined(Renderer&, const Value& v, Args&) { return v.is_undefined(); }
bool t_none(Renderer&, const Value& v, Args&) { return v.type == Type::kNone; }
bool t_boolean(Renderer&, const Value& v, Args&) { return v.type == Type::kBool; }
bool t_true(Renderer&, const Value& v, Args&) { return v.type == Type::kBool && v.b; }
bool t_false(Renderer&, const Value& v, Args&) { return v.type == Type::kBool && !v.b; }
bool t_integer(Renderer&, const Value& v, Args&) { return v.type == Type::kInt; }
bool t_float(Renderer&, const Value& v, Args&) { return v.type == Type::kFloat; }
bool t_number(Renderer&, const Value& v, Args&) { return v.is_number(); }
bool t_string(Renderer&, const Value& v, Args&) { return v.type == Type::kString; }
bool t_mapping(Renderer&, const Value& v, Args&) { return v.type == Type::kDict; }
bool t_iterable(Renderer&, const Value& v, Args&) {
  return v.type == Type::kString || v.type == Type::kList || v.type == Type::kDict || v.is_undefined() ||
         v.type == Type::kLoop;
}
bool t_sequence(Renderer&, const Value& v, Args&) {
  return v.type == Type::kString || v.type == Type::kDict || v.is_undefined() ||
         (v.type == Type::kList && (v.seq == Seq::kList || v.seq == Seq::kTuple || v.seq == Seq::kRange));
}
bool t_callable(Renderer&, const Value& v, Args&) {
  return v.type == Type::kCallable || v.is_undefined() || v.type == Type::kLoop;
}
bool t_lower(Renderer&, const Value& v, Args&) { return py_islower(soft_str(v)); }
bool t_upper(Renderer&, const Value& v, Args&) { return py_isupper(soft_str(v)); }
bool t_eq(Renderer&, const Value& v, Args& a) { return py_eq(v, test_arg(a, "eq")); }
bool t_ne(Renderer&, const Value& v, Args& a) { return !py_eq(v, test_arg(a, "ne")); }
bool t_lt(Renderer&, const Value& v, Args& a) { return py_cmp(v, test_arg(a, "lt"), "<") < 0; }
bool t_le(Renderer&, const Value& v, Args& a) { return py_cmp(v, test_arg(a, "le"), "<=") <= 0; }
bool t_gt(Renderer&, const Value& v, Args& a) { return py_cmp(v, test_arg(a, "gt"), ">") > 0; }
bool t_ge(Renderer&, const Value& v, Args& a) { return py_cmp(v, test_arg(a, "ge"), ">=") >= 0; }
bool t_in(Renderer&, const Value& v, Args& a) { return py_in(v, test_arg(a, "in")); }
bool t_even(Renderer&, const Value& v, Args&) { return py_eq(binary("%", v, Value::integer(2)), Value::integer(0)); }
bool t_odd(Renderer&, const Value& v, Args&) { return py_eq(binary("%", v, Value::integer(2)), Value::integer(1)); }
bool t_divisibleby(Renderer&, const Value& v, Args& a) {
  return py_eq(binary("%", v, test_arg(a, "divisibleby")), Value::integer(0));
}
bool t_sameas(Renderer&, const Value& v, Args& a) {
  const Value& o = test_arg(a, "sameas");
  if (v.type != o.type) return false;
  switch (v.type) {
    case Type::kNone: return true;
    case Type::kBool: return v.b == o.b;
    case Type::kInt: return v.i == o.i && v.i >= -5 && v.i <= 256;  // CPython's cached small ints
    case Type::kList: return v.list == o.list;
    case Type::kDict:
    case Type::kNamespace: return v.dict == o.dict;
    case Type::kCallable: return v.fn == o.fn;
    case Type::kLoop: return v.loop == o.loop;
    default: return false;
  }
}
bool t_filter(Renderer&, const Value& v, Args&) {
  return v.type == Type::kString && filter_table().count(v.s) > 0;
}
bool t_test(Renderer&, const Value& v, Args&);

const std::unordered_map<std::string, TestFn>& test_table() {
  static const std::unordered_map<std::string, TestFn> t = {
      {"defined", t_defined},   {"undefined", t_undefined}, {"none", t_none},         {"boolean", t_boolean},
      {"true", t_true},         {"false", t_false},         {"integer", t_integer},   {"float", t_float},
      {"number", t_number},     {"string", t_string},       {"mapping", t_mapping},   {"iterable", t_iterable},
      {"sequence", t_sequence}, {"callable", t_callable},   {"lower", t_lower},       {"upper", t_upper},
      {"eq", t_eq},             {"equalto", t_eq},          {"==", t_eq},             {"ne", t_ne},
      {"!=", t_ne},             {"lt", t_lt},               {"lessthan", t_lt},       {"<", t_lt},
      {"le", t_le},             {"<=", t_le},               {"gt", t_gt},             {"greaterthan", t_gt},
      {">", t_gt},              {"ge", t_ge},               {">=", t_ge},             {"in", t_in},
      {"even", t_even},         {"odd", t_odd},             {"divisibleby", t_divisibleby}, {"sameas", t_sameas},
      {"filter", t_filter},     {"test", t_test},
  };
  return t;
}

bool t_test(Renderer&, const Value& v, Args&) { return v.type == Type::kString && test_table().count(v.s) > 0; }

}  // namespace

// ---- the public API -----------------------------------------------------------------------------

struct JinjaTemplate::Impl {
  std::vector<Node> body;
  bool has_generation = false;
};

JinjaTemplate::JinjaTemplate(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
JinjaTemplate::JinjaTemplate(JinjaTemplate&&) noexcept = default;
JinjaTemplate& JinjaTemplate::operator=(JinjaTemplate&&) noexcept = default;
JinjaTemplate::~JinjaTemplate() = default;

JinjaTemplate JinjaTemplate::parse(std::string_view source) {
  try {
    Parser p(Lexer(source).run());
    auto impl = std::make_unique<Impl>();
    impl->body = p.parse_template();
    impl->has_generation = p.has_generation;
    return JinjaTemplate(std::move(impl));
  } catch (const Error&) {
    throw;
  } catch (const std::bad_alloc&) {
    throw Error(ErrorKind::kOutOfMemory, "chat template: out of memory while parsing");
  } catch (const std::exception& e) {
    throw Error(ErrorKind::kInternal, std::string("chat template: parsing failed: ") + e.what());
  }
}

JinjaTemplate::Output JinjaTemplate::render(const json& context) const {
  MT_CHECK(context.is_object(), ErrorKind::kInvalidArgument, "chat template: the context must be a JSON object");
  try {
    const Value ctx = from_json(context, 0);
    Output out;
    Renderer r;
    r.context = ctx.dict.get();
    r.top = &out.text;
    auto root = std::make_shared<Scope>();
    try {
      r.exec(impl_->body, root, out.text);
    } catch (Fail& f) {  // outside any statement: not expected, but never let it escape
      throw Error(ErrorKind::kInvalidArgument, "chat template: " + f.message);
    }
    root->vars.clear();  // macros and namespaces in it: drop them while the renderer lives
    out.generation = std::move(r.generation);
    return out;
  } catch (const Error&) {
    throw;
  } catch (const std::bad_alloc&) {
    throw Error(ErrorKind::kOutOfMemory, "chat template: out of memory while rendering");
  } catch (const std::exception& e) {
    throw Error(ErrorKind::kInternal, std::string("chat template: rendering failed: ") + e.what());
  }
}

bool JinjaTemplate::has_generation() const { return impl_->has_generation; }

}  // namespace mt::data
