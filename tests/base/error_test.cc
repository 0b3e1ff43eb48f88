#include "engine/base/error.h"

#include <catch2/catch.hpp>

using orpheus::printableMessage;

TEST_CASE("messages print as one readable line: binary bytes escaped, long ones cut") {
  CHECK(printableMessage("file.csv:3: expected a number") == "file.csv:3: expected a number");
  CHECK(printableMessage("caf\xc3\xa9 \xe2\x9c\x93") == "caf\xc3\xa9 \xe2\x9c\x93");  // UTF-8 stays
  CHECK(printableMessage(std::string("got 'a\x01\x7f\nb'")) == "got 'a\\x01\\x7f\\x0ab'");
  CHECK(printableMessage("bad \xff\xc3 end") == "bad \\xff\\xc3 end");  // invalid and truncated sequences
  const std::string longText(5000, 'x');
  const std::string cut = printableMessage(longText, 100);
  CHECK(cut.size() == 103);
  CHECK(cut.substr(100) == "...");
}
