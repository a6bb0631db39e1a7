#include "nn/module.h"

namespace mt::nn {

void Module::finalize_names(const std::string& prefix) {
  // A parameter's local name may hold dots (self_attn's "q_proj.bias"): what follows the previous
  // full name is kept.
  const std::string before = full_name_;
  full_name_ = prefix.empty() ? name_ : (name_.empty() ? prefix : prefix + "." + name_);
  for (auto& p : params_) {
    std::string local = !before.empty() && p->name.starts_with(before + ".") ? p->name.substr(before.size() + 1) : p->name;
    p->name = full_name_.empty() ? local : full_name_ + "." + local;
  }
  for (auto& c : children_) c->finalize_names(full_name_);
}

void Module::collect_parameters(std::vector<Parameter*>& out) {
  for (auto& p : params_) out.push_back(p.get());
  for (auto& c : children_) c->collect_parameters(out);
}

std::vector<Module*> Module::children() const {
  std::vector<Module*> out;
  for (auto& c : children_) out.push_back(c.get());
  return out;
}

void Module::add_hook(HookPoint point, Hook hook) { hooks_.emplace_back(point, std::move(hook)); }

void Module::run_hooks(HookPoint point) {
  for (auto& [p, h] : hooks_)
    if (p == point) h(*this, point);
}

Parameter* Module::add_parameter(const std::string& local, Shape shape, bool is_matrix, Init init,
                                 float init_std, TpSplit split, TpPlace place) {
  auto p = std::make_unique<Parameter>();
  p->name = local;
  p->shape = tp_local_shape(name_ + "." + local, shape, split, place);
  p->global_shape = std::move(shape);
  p->split = split;
  p->place = place;
  p->is_matrix = is_matrix;
  p->init = init;
  p->init_std = init_std;
  params_.push_back(std::move(p));
  return params_.back().get();
}

}  // namespace mt::nn
