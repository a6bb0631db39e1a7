#include "parallel/context.h"

#include <string>

#include "comm/local_backend.h"

namespace mt::parallel {

std::shared_ptr<ParallelContext> make_parallel_context(std::shared_ptr<comm::Backend> world, int tp, int pp,
                                                       bool sequence_parallel, std::chrono::milliseconds timeout, int sp) {
  if (!world) world = comm::make_local_world(1)[0];
  const int W = world->size();
  MT_CHECK(tp >= 1 && pp >= 1 && W % (tp * pp) == 0, ErrorKind::kInvalidArgument,
           "parallel.tp (" + std::to_string(tp) + ") x parallel.pp (" + std::to_string(pp) + ") must divide the " +
               std::to_string(W) + " process(es)");
  MT_CHECK(sp >= 1 && (W / (tp * pp)) % sp == 0, ErrorKind::kInvalidArgument,
           "parallel.tp (" + std::to_string(tp) + ") x parallel.sp (" + std::to_string(sp) + ") x parallel.pp (" +
               std::to_string(pp) + ") must divide the " + std::to_string(W) + " process(es)");
  auto ctx = std::make_shared<ParallelContext>();
  ctx->world = world;
  ctx->mesh = comm::DeviceMesh(W, tp, W / (tp * pp), pp);
  ctx->sequence_parallel = sequence_parallel;
  ctx->timeout = timeout;
  if (W == 1) {
    ctx->groups.tp = ctx->groups.dp = ctx->groups.pp = world;
  } else if (tp == 1 && pp == 1) {  // data parallelism only: no split, the world is the dp group
    ctx->groups.dp = world;
    ctx->groups.tp = comm::make_local_world(1)[0];
    ctx->groups.pp = comm::make_local_world(1)[0];
  } else {
    ctx->groups = comm::make_process_groups(*world, ctx->mesh, timeout);
  }
  // Ulysses: sp consecutive coordinates of the dp group (a group of one without).
  const int d = ctx->groups.dp->rank();
  ctx->sp_group = sp == 1 ? comm::make_local_world(1)[0] : sp == ctx->groups.dp->size() ? ctx->groups.dp : ctx->groups.dp->split(d / sp, d % sp);
  return ctx;
}

}  // namespace mt::parallel
