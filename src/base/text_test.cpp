// The text helpers the messages use.
#include "base/text.h"

#include <gtest/gtest.h>

namespace mt {
namespace {

TEST(Text, EditDistanceCountsInsertionsDeletionsAndSubstitutions) {
  EXPECT_EQ(edit_distance("n_layr", "n_layer"), 1);
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3);
  EXPECT_EQ(edit_distance("", "abc"), 3);
}

// A swap of 584 KiB on a filesystem with 440 KiB free was said as "needs 0 MiB, has 0 MiB free"
// (stop 73).
TEST(Text, SizesUnderAMebibyteAreSaidInKibibytes) {
  EXPECT_EQ(kib_or_mib(584 * 1024), "584 KiB");
  EXPECT_EQ(kib_or_mib(1), "1 KiB");
  EXPECT_EQ(kib_or_mib(0), "0 KiB");
  EXPECT_EQ(kib_or_mib(uint64_t{1} << 20), "1 MiB");
  EXPECT_EQ(kib_or_mib((uint64_t{3} << 20) + 5), "3 MiB");
}

}  // namespace
}  // namespace mt
