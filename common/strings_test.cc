#include "common/strings.h"

#include <gtest/gtest.h>

namespace weft {
namespace {

TEST(EscapeTerminal, ControlCharactersBecomeVisibleAndTextStays) {
  // A title change, a screen clear and a bell: nothing of them reaches the terminal.
  EXPECT_EQ(escape_terminal("\x1b]0;owned\x07hi\x1b[2J\n"), "\\x1b]0;owned\\x07hi\\x1b[2J\n");
  EXPECT_EQ(escape_terminal("a\rb\x7f\t\n"), "a\\x0db\\x7f\t\n");
  EXPECT_EQ(escape_terminal(std::string("nul\0x", 5)), "nul\\x00x");
  // UTF-8 text is kept; its C1 controls (U+009B, the 8-bit CSI) and stray bytes are not.
  EXPECT_EQ(escape_terminal("grüße ✓ 🚀"), "grüße ✓ 🚀");
  EXPECT_EQ(escape_terminal("\xc2\x9b"
                            "31m"),
            "\\xc2\\x9b31m");
  EXPECT_EQ(escape_terminal("\x9b"
                            "2J"),
            "\\x9b2J");
  EXPECT_EQ(escape_terminal("\xe2\x82"), "\\xe2\\x82");           // cut short
  EXPECT_EQ(escape_terminal("\xc0\xaf"), "\\xc0\\xaf");           // overlong '/'
  EXPECT_EQ(escape_terminal("\xed\xa0\x80"), "\\xed\\xa0\\x80");  // a surrogate
  EXPECT_EQ(escape_terminal("back\\slash"), "back\\slash");
}

}  // namespace
}  // namespace weft
